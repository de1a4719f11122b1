"""The captured graphs of two recordings, node by node: each kernel, copy and fill matched across
the runs, its pointer words turned into relocations, and its kernel entered in the plan's function
table once."""

from __future__ import annotations

from functools import partial
from typing import Any

from medusa.materialize.analysis import (
    AddressIndex,
    Finder,
    Foreign,
    MaterializeError,
    Scale,
    Unmoved,
    outside_both,
    relocate_words,
)
from medusa.trace import NodeType
from medusa.trace.run_view import RunView

Node = dict[str, Any]
Finders = tuple[Finder, Finder]  # the allocation an address falls in, in run a and in run b


class Funcs:
    """The plan's function table: a row per kernel (image digest and name), first seen first."""

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
    funcs: Funcs,
    g: int,
    i: int,
    unmoved: Unmoved,
    scale: Scale | None = None,
) -> Node:
    na, nb = a.graphs[g]["nodes"][i], b.graphs[g]["nodes"][i]
    sa, sb = a.graphs[g]["launch_seq"][i], b.graphs[g]["launch_seq"][i]
    where = f"graph {g}, node {i}"
    if na.type != nb.type:
        raise MaterializeError(f"{where}: node type {na.type} in one run, {nb.type} in the other")
    node: Node = {"type": na.type}
    finds = (partial(_find, ia, sa), partial(_find, ib, sb))
    if na.type == NodeType.KERNEL:
        # NOTE: a by-value closure may carry a host pointer the kernel never reads (PyTorch's
        # elementwise lambdas do); only a word outside all device memory of both runs passes.
        foreign = outside_both(ia, ib)
        node.update(_kernel(a, b, na, nb, funcs, where, finds, unmoved, foreign, scale))
    elif na.type in (NodeType.MEMCPY, NodeType.MEMSET):
        node.update(_copy_or_fill(na, nb, where, finds, unmoved, scale))
    elif na.type != NodeType.EMPTY:
        raise MaterializeError(f"{where}: {NodeType(na.type).name} nodes cannot be restored yet")
    return node


def _kernel(
    a: RunView,
    b: RunView,
    na: Any,
    nb: Any,
    funcs: Funcs,
    where: str,
    finds: Finders,
    unmoved: Unmoved,
    foreign: Foreign,
    scale: Scale | None,
) -> Node:
    fid, key = funcs.id(a, na.func, where)
    _, key_b = funcs.id(b, nb.func, where)
    if key != key_b:
        raise MaterializeError(f"{where}: kernel {key[1]} in one run, {key_b[1]} in the other")
    if (na.grid, na.block, na.shared_bytes) != (nb.grid, nb.block, nb.shared_bytes):
        raise MaterializeError(f"{where} ({key[1]}): launch geometry differs between the runs")
    relocs = relocate_words(
        na.params,
        nb.params,
        *finds,
        f"{where} ({key[1]})",
        unmoved,
        foreign=foreign,
        layout=a.funcs[na.func].layout,
        scale=scale,
    )
    return {
        "func": fid,
        "grid": list(na.grid),
        "block": list(na.block),
        "shared": na.shared_bytes,
        "params": bytes(na.params),
        "relocs": [list(r) for r in relocs],
    }


def _copy_or_fill(
    na: Any, nb: Any, where: str, finds: Finders, unmoved: Unmoved, scale: Scale | None
) -> Node:
    _check_one_row(na, where)
    words_a = (na.dst, na.src) if na.type == NodeType.MEMCPY else (na.dst,)
    words_b = (nb.dst, nb.src) if nb.type == NodeType.MEMCPY else (nb.dst,)
    pa = b"".join(int(w).to_bytes(8, "little") for w in words_a)
    pb = b"".join(int(w).to_bytes(8, "little") for w in words_b)
    what = f"{where} ({NodeType(na.type).name.lower()})"
    relocs = relocate_words(pa, pb, *finds, what, unmoved, scale=scale)
    if len(relocs) != len(pb) // 8:
        raise MaterializeError(f"{where}: a copy or fill of memory no allocation holds")
    return {
        "relocs": [list(r) for r in relocs],
        "width": na.width,
        "height": na.height,
        "depth": na.depth,
        "value": na.value,
        "elem": na.element_size,
        "memtypes": list(na.memory_types),
    }


def graph_plan(
    a: RunView,
    b: RunView,
    ia: AddressIndex,
    ib: AddressIndex,
    funcs: Funcs,
    g: int,
    unmoved: Unmoved,
    scale: Scale | None = None,
) -> dict[str, Any]:
    """Graph G of both runs as one plan graph; with SCALE, pointers whose offset follows the
    scaled allocations' count carry their slope (analysis.Scale)."""
    ga, gb = a.graphs[g], b.graphs[g]
    if len(ga["nodes"]) != len(gb["nodes"]) or ga["edges"] != gb["edges"]:
        raise MaterializeError(
            f"graph {g}: {len(ga['nodes'])} nodes / {len(ga['edges'])} edges in one run, "
            f"{len(gb['nodes'])} / {len(gb['edges'])} in the other (or edges differ)"
        )
    nodes, refused = [], []
    for i in range(len(ga["nodes"])):
        try:
            nodes.append(_node(a, b, ia, ib, funcs, g, i, unmoved, scale))
        except MaterializeError as e:  # NOTE: every refused node of the graph is named at once
            refused.append(str(e))
    if refused:
        more = f" (and {len(refused) - 1} more nodes: " + "; ".join(refused[1:4]) + ")"
        raise MaterializeError(refused[0] + (more if len(refused) > 1 else ""))
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


def _find(index: AddressIndex, seq: int, value: int) -> tuple[int, int, int] | None:
    return index.find(value, seq)
