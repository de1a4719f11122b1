"""What each kernel node of a recorded graph reads and writes, per allocation.

The recording must have been made with an instrumented back-end (simcuda: MEDUSA_SIM_ACCESSES=1),
which writes an ACCESS record per kernel run. A node's accesses come from a replay of its graph
when the recording has one, else from the newest eager launch before the capture with the same
kernel, geometry and parameter bytes (an engine's warm-up step, as the reference engine and vLLM
run before they capture).

NOTE: simcuda reports whole pages. An allocation counts as accessed by a node only through pages
that hold no byte of an allocation the node's parameters point into, unless its own parameters
point into it: a 256-byte buffer sharing a page with the one the kernel really read is then not
blamed. Within an allocation, extents are page-rounded (clipped to the allocation)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from medusa.materialize.analysis import AddressIndex
from medusa.tessera.library import api_extents
from medusa.tessera.modes import READ, WRITE
from medusa.trace import Ev, NodeType
from medusa.trace import records as R
from medusa.trace.reader import Trace
from medusa.trace.run_view import RunView

Key = tuple[int, int]  # (allocation kind, index), as in a relocation


@dataclass
class NodeAccesses:
    graph: int
    node: int
    kernel: str
    source: str  # "replay", "warm-up" or "api" (a library kernel, from its arguments)
    incomplete: bool
    granularity: int
    extents: dict[Key, list[tuple[int, int, int]]]  # (lo, hi, READ|WRITE), offsets in the alloc
    pointers: dict[int, tuple[int, int, int]]  # param byte -> (kind, index, offset) it holds
    indirect: set[Key] = field(default_factory=set)  # accessed, but no parameter points there

    def mode(self, key: Key) -> int:
        m = 0
        for _, _, f in self.extents.get(key, ()):
            m |= f
        return m

    def bytes(self, mode: int) -> int:
        return sum(hi - lo for ex in self.extents.values() for lo, hi, f in ex if f & mode)

    @property
    def dereferenced(self) -> set[int]:
        """Parameter bytes whose word points into memory the node accessed."""
        return {off for off, (k, i, _) in self.pointers.items() if (k, i) in self.extents}


def _eager_accesses(trace: Trace) -> dict[tuple, list[tuple[int, R.Access]]]:
    """(func, grid, block, params) -> [(launch seq, its accesses)] of eager kernel runs."""
    out: dict[tuple, list[tuple[int, R.Access]]] = defaultdict(list)
    pending: R.Access | None = None
    for e in trace.events(Ev.ACCESS, Ev.LAUNCH):
        if isinstance(e, R.Access):
            pending = e if not e.node else pending
        elif isinstance(e, R.Launch) and pending is not None and not e.node and e.result == 0:
            out[(e.func, e.grid, e.block, bytes(e.params))].append((e.seq, pending))
            pending = None
    return out


@dataclass
class _Api:
    """A library kernel's accesses from its arguments, shaped as an instrumented run's."""

    extents: list[tuple[int, int, int]]
    granularity: int = 1
    incomplete: bool = False


def _live_rows(index: AddressIndex, seq: int) -> np.ndarray:
    return np.flatnonzero((index.seq < seq) & (index.free > seq) & (index.end > index.start))


def _attribute(
    acc: R.Access | _Api, index: AddressIndex, seq: int, pointers: dict
) -> tuple[dict, set]:
    rows = _live_rows(index, seq)
    starts, ends = index.start[rows].astype(np.int64), index.end[rows].astype(np.int64)
    pointed = {(k, i) for k, i, _ in pointers.values()}
    page = max(acc.granularity, 1)
    own = [  # page spans of the allocations a parameter points into
        (int(index.start[r]) // page, (int(index.end[r]) - 1) // page)
        for r in rows
        if (index.kind[r], index.index[r]) in pointed
    ]

    def shared(p: int) -> bool:
        return any(lo <= p <= hi for lo, hi in own)

    extents: dict[Key, list[tuple[int, int, int]]] = defaultdict(list)
    indirect: set[Key] = set()
    for lo, hi, mode in acc.extents:
        for j in np.flatnonzero((starts < hi) & (ends > lo)).tolist():
            r = rows[j]
            key = (index.kind[r], index.index[r])
            a, b = max(lo, int(starts[j])), min(hi, int(ends[j]))
            if key not in pointed:
                # Allocations do not overlap, so only the first and last page can be shared.
                pa, pb = a // page, (b - 1) // page
                pa += shared(pa)
                pb -= pb >= pa and shared(pb)
                if pa > pb:
                    continue
                a, b = max(a, pa * page), min(b, (pb + 1) * page)
                indirect.add(key)
            extents[key].append((a - int(starts[j]), b - int(starts[j]), mode))
    return dict(extents), indirect


def _pointers(params: bytes, index: AddressIndex, seq: int) -> dict[int, tuple[int, int, int]]:
    """Every 8-byte parameter word that holds an address inside a live allocation."""
    n = len(params) // 8
    words = np.frombuffer(params[: n * 8], "<u8")
    rows = _live_rows(index, seq)
    if not rows.size or not n:
        return {}
    lo, hi = index.start[rows].min(), index.end[rows].max()
    out = {}
    for w in np.flatnonzero((words >= lo) & (words <= hi)).tolist():
        r = index.find(int(words[w]), seq)
        if r is not None:
            out[8 * w] = r
    return out


def analyze(run: RunView, *, api: bool = True) -> list[list[NodeAccesses | None]]:
    """Per graph, per node: the node's accesses (None for a node that is not a kernel, or a
    kernel no instrumented run of which was recorded). api: library kernels (mblas GEMMs) by
    their arguments (medusa.tessera.library), byte-exact, whether or not they were recorded."""
    index = AddressIndex(run)
    eager = _eager_accesses(run.trace)
    replayed = {a.node: a for a in run.trace.of(R.Access, Ev.ACCESS) if a.node}
    out: list[list[NodeAccesses | None]] = []
    for g, graph in enumerate(run.graphs):
        row: list[NodeAccesses | None] = []
        for i, (n, seq) in enumerate(zip(graph["nodes"], graph["launch_seq"], strict=True)):
            if n.type != NodeType.KERNEL:
                row.append(None)
                continue
            func = run.funcs.get(n.func)
            spans = api_extents(func.name, bytes(n.params), func.layout) if func and api else None
            acc: R.Access | _Api | None = _Api(spans) if spans is not None else None
            source = "api"
            if acc is None:
                acc, source = replayed.get(n.node), "replay"
            if acc is None:
                runs = eager.get((n.func, n.grid, n.block, bytes(n.params)), [])
                before = [a for s, a in runs if s < seq]
                acc, source = (before[-1] if before else None), "warm-up"
            if acc is None:
                row.append(None)
                continue
            ptrs = _pointers(bytes(n.params), index, seq)
            extents, indirect = _attribute(acc, index, seq, ptrs)
            name = run.funcs[n.func].name if n.func in run.funcs else f"{n.func:#x}"
            row.append(
                NodeAccesses(
                    g, i, name, source, acc.incomplete, acc.granularity, extents, ptrs, indirect
                )
            )
        out.append(row)
    return out


def copy_accesses(
    node: R.Node, index: AddressIndex, seq: int
) -> dict[Key, list[tuple[int, int, int]]]:
    """A memcpy or memset node's accesses, by its API semantics (1-D, as simcuda records them)."""
    out: dict[Key, list[tuple[int, int, int]]] = {}
    nbytes = (
        node.width
        * max(node.height, 1)
        * (node.element_size if node.type == NodeType.MEMSET else 1)
    )
    for addr, mode in ((node.dst, WRITE), (node.src, READ)):
        if node.type == NodeType.MEMSET and mode == READ:
            continue
        r = index.find(addr, seq)
        if r is not None and nbytes:
            out.setdefault((r[0], r[1]), []).append((r[2], r[2] + nbytes, mode))
    return out
