"""The restore plan: what the analysis of two recordings hands to the artifact."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from medusa.artifact.layout import RELOC, pack_attrs, pack_edges, pack_nodes
from medusa.materialize.analysis import (
    AddressIndex,
    MaterializeError,
    Unmoved,
    relocate_contents,
    relocate_words,
)
from medusa.trace import NodeType
from medusa.trace.run_view import DEVICE, GLOBAL, HOST, KIND_NAMES, NEVER, VMM, RunView

Node = dict[str, Any]


def _check_allocs(a: RunView, b: RunView) -> None:
    if len(a.allocs) != len(b.allocs):
        raise MaterializeError(
            f"the runs made {len(a.allocs)} and {len(b.allocs)} allocations: the start-up is not "
            "deterministic for this configuration"
        )
    for x, y in zip(a.allocs, b.allocs, strict=True):
        if (x.phase, x.ordinal, x.size, x.kind) != (y.phase, y.ordinal, y.size, y.kind):
            raise MaterializeError(
                f"allocation #{x.index} differs between the runs: {x.size} bytes in phase "
                f"{x.phase!r} (#{x.ordinal}) vs {y.size} bytes in phase {y.phase!r} (#{y.ordinal})"
            )


class _Funcs:
    def __init__(self) -> None:
        self.table: list[dict[str, Any]] = []
        self.ids: dict[tuple[str, str], int] = {}

    def id(self, run: RunView, handle: int, where: str) -> tuple[int, tuple[str, str]]:
        f = run.funcs.get(handle)
        if f is None:
            raise MaterializeError(f"{where}: its kernel was never seen by the recorder")
        key = (f.sha256, f.name)
        if key not in self.ids:
            self.ids[key] = len(self.table)
            self.table.append(
                {
                    "name": f.name,
                    "sha256": f.sha256,
                    "symbol": f.symbol,
                    "layout": [list(p) for p in f.layout],
                    "attrs": sorted(f.attrs.items()),
                }
            )
        return self.ids[key], key


# NOTE: saved contents live in the artifact and are uploaded at every restore; a bigger buffer
# belongs to a phase the restore runs (the engine fills it), not in the artifact.
MAX_SAVED_BYTES = 64 << 20


def _check_one_row(n: Any, where: str) -> None:
    """A copy or fill must be 1-D: the recording keeps no pitches (a trace's memset record has no
    room for one), so restore could only rebuild it wrong."""
    copy = n.type == NodeType.MEMCPY
    if n.height > 1 or (copy and n.depth > 1):
        shape = f"{n.height} rows" + (f" x {n.depth} slices" if copy and n.depth > 1 else "")
        raise MaterializeError(
            f"{where}: a {'copy' if copy else 'fill'} of {shape}, whose pitch the recording does "
            f"not keep: restore rebuilds 1-D {'copies' if copy else 'fills'} only; "
            f"{'copy' if copy else 'fill'} row by row (one 1-D call per row), or leave it out of "
            "the captured graph"
        )


def _node(
    a: RunView,
    b: RunView,
    ia: AddressIndex,
    ib: AddressIndex,
    funcs: _Funcs,
    g: int,
    i: int,
    unmoved: Unmoved,
) -> Node:
    na, nb = a.graphs[g]["nodes"][i], b.graphs[g]["nodes"][i]
    sa, sb = a.graphs[g]["launch_seq"][i], b.graphs[g]["launch_seq"][i]
    where = f"graph {g}, node {i}"
    if na.type != nb.type:
        raise MaterializeError(f"{where}: node type {na.type} in one run, {nb.type} in the other")
    node: Node = {"type": na.type}
    find_a, find_b = (lambda v: ia.find(v, sa)), (lambda v: ib.find(v, sb))
    if na.type == NodeType.KERNEL:
        fid, key = funcs.id(a, na.func, where)
        _, key_b = funcs.id(b, nb.func, where)
        if key != key_b:
            raise MaterializeError(f"{where}: kernel {key[1]} in one run, {key_b[1]} in the other")
        if (na.grid, na.block, na.shared_bytes) != (nb.grid, nb.block, nb.shared_bytes):
            raise MaterializeError(f"{where} ({key[1]}): launch geometry differs between the runs")
        node.update(
            func=fid,
            grid=list(na.grid),
            block=list(na.block),
            shared=na.shared_bytes,
            params=bytes(na.params),
            relocs=[
                list(r)
                for r in relocate_words(
                    na.params, nb.params, find_a, find_b, f"{where} ({key[1]})", unmoved
                )
            ],
        )
    elif na.type in (NodeType.MEMCPY, NodeType.MEMSET):
        _check_one_row(na, where)
        words_a = (na.dst, na.src) if na.type == NodeType.MEMCPY else (na.dst,)
        words_b = (nb.dst, nb.src) if nb.type == NodeType.MEMCPY else (nb.dst,)
        pa = b"".join(int(w).to_bytes(8, "little") for w in words_a)
        pb = b"".join(int(w).to_bytes(8, "little") for w in words_b)
        relocs = relocate_words(
            pa, pb, find_a, find_b, f"{where} ({NodeType(na.type).name.lower()})", unmoved
        )
        if len(relocs) != len(pb) // 8:
            raise MaterializeError(f"{where}: a copy or fill of memory no allocation holds")
        node.update(
            relocs=[list(r) for r in relocs],
            width=na.width,
            height=na.height,
            depth=na.depth,
            value=na.value,
            elem=na.element_size,
            memtypes=list(na.memory_types),
        )
    elif na.type != NodeType.EMPTY:
        raise MaterializeError(f"{where}: {NodeType(na.type).name} nodes cannot be restored yet")
    return node


def _graph(
    a: RunView,
    b: RunView,
    ia: AddressIndex,
    ib: AddressIndex,
    funcs: _Funcs,
    g: int,
    unmoved: Unmoved,
) -> dict[str, Any]:
    ga, gb = a.graphs[g], b.graphs[g]
    if len(ga["nodes"]) != len(gb["nodes"]) or ga["edges"] != gb["edges"]:
        raise MaterializeError(
            f"graph {g}: {len(ga['nodes'])} nodes / {len(ga['edges'])} edges in one run, "
            f"{len(gb['nodes'])} / {len(gb['edges'])} in the other (or edges differ)"
        )
    nodes = [_node(a, b, ia, ib, funcs, g, i, unmoved) for i in range(len(ga["nodes"]))]
    attrs = _attrs(a, b, ia, ib, g)
    return {"nodes": nodes, "edges": [list(e) for e in ga["edges"]], "attrs": attrs}


def _attrs(a: RunView, b: RunView, ia: AddressIndex, ib: AddressIndex, g: int) -> list[list]:
    """Kernel node attributes, [node, attr, value, relocs]: a word that moves with an allocation
    between the runs (an access-policy window's base_ptr) is relocated like a parameter word."""
    ga, gb = a.graphs[g]["attrs"], b.graphs[g]["attrs"]
    if [x[:2] for x in ga] != [x[:2] for x in gb]:
        raise MaterializeError(f"graph {g}: the kernel node attributes differ between the runs")
    out = []
    for (n, attr, va), (_, _, vb) in zip(ga, gb, strict=True):
        sa, sb = a.graphs[g]["launch_seq"][n], b.graphs[g]["launch_seq"][n]
        where = f"graph {g}, node {n}, attribute {attr}"
        relocs = relocate_words(
            bytes(va), bytes(vb), partial(_find, ia, sa), partial(_find, ib, sb), where
        )
        out.append([n, attr, bytes(va), [list(r) for r in relocs]])
    return out


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
            rows, params, relocs = pack_nodes(g["nodes"])
            attrs, attr_relocs = pack_attrs(g["attrs"], len(relocs))
            templates.append(
                {
                    "nodes": rows.tobytes(),
                    "params": params,
                    "relocs": relocs.tobytes(),
                    "edges": pack_edges(g["edges"]).tobytes(),
                    "num_nodes": len(rows),
                    "node_dicts": g["nodes"],
                }
            )
            out.append(
                {
                    "template": keys[key],
                    "idx": b"",
                    "rows": b"",
                    "params": b"",
                    "relocs": attr_relocs.tobytes(),
                    "attrs": attrs.tobytes(),
                }
            )
            continue
        t = templates[keys[key]]
        changed = [
            i for i, (tn, n) in enumerate(zip(t["node_dicts"], g["nodes"], strict=True)) if tn != n
        ]
        base = len(t["relocs"]) // RELOC.itemsize
        rows, params, relocs = pack_nodes([g["nodes"][i] for i in changed], len(t["params"]), base)
        attrs, attr_relocs = pack_attrs(g["attrs"], base + len(relocs))
        out.append(
            {
                "template": keys[key],
                "idx": np.array(changed, "<u4").tobytes(),
                "rows": rows.tobytes(),
                "params": params,
                "relocs": relocs.tobytes() + attr_relocs.tobytes(),
                "attrs": attrs.tobytes(),
            }
        )
    for t in templates:
        del t["node_dicts"]
    return templates, out


def _reloc_counts(graphs: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {name: 0 for name in KIND_NAMES}
    for g in graphs:
        for n in g["nodes"]:
            for r in n.get("relocs", ()):
                counts[KIND_NAMES[r[1]]] += 1
    return counts


def _find(index: AddressIndex, seq: int, value: int) -> tuple[int, int, int] | None:
    return index.find(value, seq)


def _contents(
    a: RunView,
    b: RunView,
    ia: AddressIndex,
    ib: AddressIndex,
    unmoved: Unmoved,
    roots: set[int],
    skipped: Callable[[str], bool],
) -> dict[int, dict[str, Any]]:
    """The saved contents of every permanent buffer of a skipped phase that a graph can reach:
    named by a node, or reached from saved contents through a pointer word (a device-side
    pointer table), transitively."""
    contents: dict[int, dict[str, Any]] = {}
    todo, seen = sorted(roots), set(roots)
    while todo:
        i = todo.pop()
        al = a.allocs[i]
        if not skipped(al.phase):
            continue  # the engine makes (and fills) this one itself
        if al.free_seq != NEVER:
            raise MaterializeError(
                f"allocation #{i} ({al.size} bytes, phase {al.phase!r}) is used by a graph but "
                "freed during start-up: the graph would point at freed memory"
            )
        saved = _saved(a, b, ia, ib, unmoved, i)
        if saved is None:
            continue
        contents[i] = saved
        for r in saved["relocs"]:
            if r[1] in (DEVICE, HOST) and r[2] not in seen:
                seen.add(r[2])
                todo.append(r[2])
    return dict(sorted(contents.items()))


def _saved(
    a: RunView, b: RunView, ia: AddressIndex, ib: AddressIndex, unmoved: Unmoved, i: int
) -> dict[str, Any] | None:
    """One buffer's contents with its pointer words relocated; None when nothing worth saving
    was recorded (every word is stale: start-up never wrote it, so no graph can depend on it)."""
    al, bl = a.allocs[i], b.allocs[i]
    if al.seq in a.unsaved or bl.seq in b.unsaved:
        raise MaterializeError(
            f"allocation #{i} ({al.size} bytes, phase {al.phase!r}) is reached by a graph but "
            "the recorder could not save its contents (too large to snapshot): make it in a "
            "phase the restore runs"
        )
    if al.seq not in a.contents or bl.seq not in b.contents:
        return None
    seq_a, data_a = a.contents[al.seq]
    seq_b, data_b = b.contents[bl.seq]
    where = f"allocation #{i}'s contents"
    relocs, stale = relocate_contents(data_a, data_b, ia.at(seq_a), ib.at(seq_b), where, unmoved)
    if not relocs and stale == len(data_a) // 8:
        return None
    if len(data_a) > MAX_SAVED_BYTES:
        raise MaterializeError(
            f"allocation #{i} ({al.size} bytes, phase {al.phase!r}) is reached by a graph and "
            f"its contents would be saved in the artifact, but saved contents are bounded at "
            f"{MAX_SAVED_BYTES >> 20} MiB per allocation: make (and fill) it in a phase the "
            "restore runs instead"
        )
    return {"data": data_a, "relocs": [list(r) for r in relocs]}


def build_plan(a: RunView, b: RunView, skipped: Callable[[str], bool]) -> dict[str, Any]:
    _check_allocs(a, b)
    if len(a.graphs) != len(b.graphs):
        raise MaterializeError(f"the runs captured {len(a.graphs)} and {len(b.graphs)} graphs")
    ia, ib = AddressIndex(a), AddressIndex(b)
    unmoved = Unmoved(a, b)
    funcs = _Funcs()
    graphs = [_graph(a, b, ia, ib, funcs, g, unmoved) for g in range(len(a.graphs))]
    referenced = {
        r[2]
        for g in graphs
        for n in g["nodes"]
        for r in n.get("relocs", ())
        if r[1] in (DEVICE, HOST)
    }
    for i in sorted(referenced):
        x = a.allocs[i]
        if skipped(x.phase) and "HostRegister" in x.api:
            # NOTE: the restore would replay it as an empty cudaHostAlloc, and the graphs would
            # read zeros (or poison) where the caller's registered memory was.
            raise MaterializeError(
                f"a graph uses host memory registered ({x.api}) in skipped phase {x.phase!r}; "
                "a restore cannot recreate memory the program owns (register it in a phase the "
                "restore runs, e.g. while loading weights)"
            )
    contents = _contents(a, b, ia, ib, unmoved, referenced, skipped)
    used_vmm = sorted(
        {r[2] for g in graphs for n in g["nodes"] for r in n.get("relocs", ()) if r[1] == VMM}
    )
    for i in used_vmm:
        m, mb = a.vmm[i], b.vmm[i] if i < len(b.vmm) else None
        if mb is None or (m[0], m[1], m[3]) != (mb[0], mb[1], mb[3]):
            raise MaterializeError(f"VMM reservation #{i} differs between the runs")
        if skipped(m[0]):
            raise MaterializeError(
                f"a graph uses VMM reservation #{i} made in skipped phase {m[0]!r}; restore does "
                "not replay VMM reservations (reserve it in a phase the restore runs)"
            )
    used_globals = sorted(
        {r[2] for g in graphs for n in g["nodes"] for r in n.get("relocs", ()) if r[1] == GLOBAL}
    )
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
