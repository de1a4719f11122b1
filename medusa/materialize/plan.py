"""The restore plan: what the analysis of two recordings hands to the artifact. The graphs
(graphs.py) and the saved contents (contents.py) are built in their own modules; here they are
checked against what a restore can replay, and packed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from medusa.artifact.layout import RELOC, pack_attrs, pack_edges, pack_nodes
from medusa.materialize.analysis import AddressIndex, MaterializeError, Scale, Unmoved
from medusa.materialize.contents import saved_contents
from medusa.materialize.graphs import Funcs, graph_plan
from medusa.trace.run_view import DEVICE, GLOBAL, HOST, KIND_NAMES, NEVER, VMM, RunView


def _check_allocs(a: RunView, b: RunView, resized: frozenset[int] = frozenset()) -> None:
    if len(a.allocs) != len(b.allocs):
        raise MaterializeError(
            f"the runs made {len(a.allocs)} and {len(b.allocs)} allocations: the start-up is not "
            "deterministic for this configuration"
        )
    for x, y in zip(a.allocs, b.allocs, strict=True):
        size_b = x.size if x.index in resized else y.size  # recorded at another count
        if (x.phase, x.ordinal, x.size, x.kind) != (y.phase, y.ordinal, size_b, y.kind):
            raise MaterializeError(
                f"allocation #{x.index} differs between the runs: {x.size} bytes in phase "
                f"{x.phase!r} (#{x.ordinal}) vs {y.size} bytes in phase {y.phase!r} (#{y.ordinal})"
            )


def _templates(graphs: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """Graphs sharing a topology (node types, kernels, edges) are stored once, packed for the C
    builder, plus per graph the node rows that differ (with their own parameters and
    relocations), so restore applies them with one vectorized assignment."""
    templates: list[dict] = []
    keys: dict[tuple, int] = {}
    out = []
    for g in graphs:
        key = (
            tuple((n["type"], n.get("func", -1)) for n in g["nodes"]),
            tuple(map(tuple, g["edges"])),
        )
        if key not in keys:
            keys[key] = len(templates)
            template, rows = _template(g)
            templates.append(template)
        else:
            rows = _variant(templates[keys[key]], g)
        out.append({"template": keys[key], **rows})
    for t in templates:
        del t["node_dicts"]
    return templates, out


def _template(g: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A new topology: its packed nodes, and the graph's own rows (its attributes only)."""
    rows, params, relocs, scaled = pack_nodes(g["nodes"])
    attrs, attr_relocs = pack_attrs(g["attrs"], len(relocs))
    template = {
        "nodes": rows.tobytes(),
        "params": params,
        "relocs": relocs.tobytes(),
        "scaled": scaled,
        "edges": pack_edges(g["edges"]).tobytes(),
        "num_nodes": len(rows),
        "node_dicts": g["nodes"],
    }
    own = {"idx": b"", "rows": b"", "params": b"", "relocs": attr_relocs.tobytes(), "scaled": []}
    return template, {**own, "attrs": attrs.tobytes()}


def _variant(t: dict[str, Any], g: dict[str, Any]) -> dict[str, Any]:
    """A graph of template T's topology: the node rows that differ from T's, packed after T's."""
    changed = [
        i for i, (tn, n) in enumerate(zip(t["node_dicts"], g["nodes"], strict=True)) if tn != n
    ]
    base = len(t["relocs"]) // RELOC.itemsize
    nodes = [g["nodes"][i] for i in changed]
    rows, params, relocs, scaled = pack_nodes(nodes, len(t["params"]), base)
    attrs, attr_relocs = pack_attrs(g["attrs"], base + len(relocs))
    return {
        "idx": np.array(changed, "<u4").tobytes(),
        "rows": rows.tobytes(),
        "params": params,
        "relocs": relocs.tobytes() + attr_relocs.tobytes(),
        "scaled": scaled,
        "attrs": attrs.tobytes(),
    }


def _reloc_counts(graphs: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {name: 0 for name in KIND_NAMES}
    for g in graphs:
        for n in g["nodes"]:
            for r in n.get("relocs", ()):
                counts[KIND_NAMES[r[1]]] += 1
    return counts


def _used(graphs: list[dict[str, Any]], kinds: tuple[int, ...]) -> list[int]:
    """The allocations (or reservations, or globals) of KINDS that a graph node points into."""
    return sorted(
        {r[2] for g in graphs for n in g["nodes"] for r in n.get("relocs", ()) if r[1] in kinds}
    )


def _check_registered(a: RunView, referenced: list[int], skipped: Callable[[str], bool]) -> None:
    for i in referenced:
        x = a.allocs[i]
        if skipped(x.phase) and "HostRegister" in x.api:
            # NOTE: the restore would replay it as an empty cudaHostAlloc, and the graphs would
            # read zeros (or poison) where the caller's registered memory was.
            raise MaterializeError(
                f"a graph uses host memory registered ({x.api}) in skipped phase {x.phase!r}; "
                "a restore cannot recreate memory the program owns (register it in a phase the "
                "restore runs, e.g. while loading weights)"
            )


def _check_vmm(a: RunView, b: RunView, used_vmm: list[int], skipped: Callable[[str], bool]) -> None:
    for i in used_vmm:
        m, mb = a.vmm[i], b.vmm[i] if i < len(b.vmm) else None
        if mb is None or (m[0], m[1], m[3]) != (mb[0], mb[1], mb[3]):
            raise MaterializeError(f"VMM reservation #{i} differs between the runs")
        if skipped(m[0]):
            raise MaterializeError(
                f"a graph uses VMM reservation #{i} made in skipped phase {m[0]!r}; restore does "
                "not replay VMM reservations (reserve it in a phase the restore runs)"
            )


def build_plan(
    a: RunView,
    b: RunView,
    skipped: Callable[[str], bool],
    scale_by: tuple[str, int, int] | None = None,
) -> dict[str, Any]:
    """The plan of two recordings. scale_by: (phase, count in run a, count in run b) when the
    second run was recorded with another count (KV blocks) that the phase's device allocations
    are sized by: their sizes may differ, and pointers into them whose offsets follow the count
    are kept with their slope, so a restore can use another count (plan["scale"])."""
    scale = _scale(a, scale_by)
    _check_allocs(a, b, scale.allocs if scale else frozenset())
    if len(a.graphs) != len(b.graphs):
        raise MaterializeError(f"the runs captured {len(a.graphs)} and {len(b.graphs)} graphs")
    ia, ib = AddressIndex(a), AddressIndex(b)
    unmoved = Unmoved(a, b)
    funcs = Funcs()
    graphs = [graph_plan(a, b, ia, ib, funcs, g, unmoved, scale) for g in range(len(a.graphs))]
    referenced = _used(graphs, (DEVICE, HOST))
    _check_registered(a, referenced, skipped)
    contents = saved_contents(a, b, ia, ib, unmoved, set(referenced), skipped, scale)
    used_vmm = _used(graphs, (VMM,))
    _check_vmm(a, b, used_vmm, skipped)
    plan = _packed(a, graphs, funcs, contents, used_vmm, _used(graphs, (GLOBAL,)), skipped)
    scaled = _pop_scaled(plan)
    if scale is not None and scale_by is not None:
        plan["scale"] = {
            "phase": scale_by[0],
            "count": scale.count_a,
            "allocs": sorted(scale.allocs),
            "relocs": scaled,
        }
    return plan


def _pop_scaled(plan: dict[str, Any]) -> list[list[int]]:
    """The relocations whose offset follows the count, [table (0 template, 1 graph), its index,
    relocation row in its relocs, slope], taken out of the templates and graphs (whose fields a
    plan without a count keeps as they were)."""
    out = []
    for table, rows in enumerate((plan["templates"], plan["graphs"])):
        for i, t in enumerate(rows):
            out += [[table, i, row, slope] for row, slope in t.pop("scaled")]
    return out


def _scale(a: RunView, scale_by: tuple[str, int, int] | None) -> Scale | None:
    if scale_by is None:
        return None
    phase, count_a, count_b = scale_by
    allocs = frozenset(x.index for x in a.allocs if x.phase == phase and x.kind == DEVICE)
    if not allocs or count_a <= 0 or count_b <= 0 or count_a == count_b:
        raise MaterializeError(
            f"the runs were to differ in the count that phase {phase!r} is sized by, but "
            f"{len(allocs)} device allocations were made in it with counts {count_a} and "
            f"{count_b}: record the second run with another positive count"
        )
    return Scale(allocs, count_a, count_b)


def _packed(
    a: RunView,
    graphs: list[dict[str, Any]],
    funcs: Funcs,
    contents: dict[int, dict[str, Any]],
    used_vmm: list[int],
    used_globals: list[int],
    skipped: Callable[[str], bool],
) -> dict[str, Any]:
    templates, per_graph = _templates(graphs)
    phases = list(dict.fromkeys(x.phase for x in a.allocs))
    return {
        "allocs": [[x.phase, x.ordinal, x.kind, x.size, x.free_seq != NEVER] for x in a.allocs],
        "skipped_phases": [p for p in phases if skipped(p)],
        "replay": [[k, i] for k, i in a.events if skipped(a.allocs[i].phase)],
        "funcs": funcs.table,
        "globals": [
            {
                "sha256": a.globals[i][2],
                "name": a.globals[i][3],
                "size": a.globals[i][1],
                "index": i,
            }
            for i in used_globals
        ],
        "vmm": [
            {"index": i, "phase": a.vmm[i][0], "ordinal": a.vmm[i][1], "size": a.vmm[i][3]}
            for i in used_vmm
        ],
        "templates": templates,
        "graphs": per_graph,
        "contents": contents,
        "num_nodes": sum(len(g["nodes"]) for g in graphs),
        "relocations": _reloc_counts(graphs),
    }
