"""From two recordings of one start-up (the second with the device address layout shifted) to a
restore plan: allocations by (phase, ordinal), kernels by (image hash, name), and every graph with
each 8-byte parameter word either a constant or a relocation (kind, index, offset).

Nothing here knows a kernel: a word is a pointer exactly when it moves with its allocation between
the two recordings, and it points where the allocation history at that moment says."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from medusa.trace import Ev, Trace
from medusa.trace import records as R

DEVICE, HOST, GLOBAL, VMM = 0, 1, 2, 3
KIND_NAMES = ("device", "host-mapped", "module global", "vmm")
NEVER = np.iinfo(np.int64).max


class MaterializeError(ValueError):
    """The two recordings disagree, or a graph uses something that cannot be restored."""


@dataclass
class Alloc:
    index: int
    phase: str
    ordinal: int
    kind: int  # DEVICE or HOST
    size: int
    api: str
    addr: int  # the device-visible address in this run
    seq: int
    free_seq: int = NEVER


@dataclass
class Func:
    name: str
    sha256: str
    symbol: str
    layout: list[tuple[int, int]]
    attrs: dict[int, int] = field(default_factory=dict)


@dataclass
class RunView:
    """One recording, indexed for analysis."""

    trace: Trace
    allocs: list[Alloc]
    events: list[tuple[str, int]]  # ("a" | "f", alloc index), in order
    globals: list[tuple[int, int, str, str, int]]  # addr, size, sha256, name, seq
    funcs: dict[int, Func]
    loads: dict[int, str]  # library/module handle -> image sha256
    graphs: list[dict]
    contents: dict[int, tuple[int, bytes]]  # alloc seq -> (content seq, bytes)
    device: R.Device | None
    vmm: list[tuple[str, int, int, int, int, int]] = field(default_factory=list)
    # (phase, ordinal, addr, size, map seq, unmap seq) of each cuMemMap

    @classmethod
    def build(cls, trace: Trace, *, graphs: bool = True) -> RunView:
        """Indexes a recording; graphs=False skips what only materialization needs."""
        allocs: list[Alloc] = []
        events: list[tuple[str, int]] = []
        by_seq: dict[int, int] = {}
        phase, ordinals = "start", defaultdict[str, int](int)
        vmm: list[tuple[str, int, int, int, int, int]] = []
        vmm_ordinals: dict[str, int] = defaultdict(int)
        kinds = (Ev.MARK, Ev.ALLOC, Ev.FREE, Ev.HOST_ALLOC, Ev.HOST_FREE, Ev.VMM_MAP, Ev.VMM_UNMAP)
        for e in trace.events(*kinds):
            if isinstance(e, R.Mark):
                phase = e.phase
            elif isinstance(e, R.VmmMap) and e.result == 0:
                vmm.append((phase, vmm_ordinals[phase], e.addr, e.size, e.seq, NEVER))
                vmm_ordinals[phase] += 1
            elif isinstance(e, R.VmmUnmap):
                for j, m in enumerate(vmm):
                    if m[2] == e.addr and m[5] == NEVER:
                        vmm[j] = (*m[:5], e.seq)
            elif isinstance(e, R.Alloc | R.HostAlloc) and e.result == 0:
                kind = DEVICE if isinstance(e, R.Alloc) else HOST
                addr = e.addr if isinstance(e, R.Alloc) else (e.device or e.host)
                a = Alloc(len(allocs), phase, ordinals[phase], kind, e.size, e.api, addr, e.seq)
                ordinals[phase] += 1
                by_seq[e.seq] = a.index
                allocs.append(a)
                events.append(("a", a.index))
            elif isinstance(e, R.Free | R.HostFree) and e.alloc_seq in by_seq:
                i = by_seq[e.alloc_seq]
                allocs[i].free_seq = e.seq
                events.append(("f", i))
        loads = {x.handle: x.sha256 for x in trace.of(R.Load, Ev.LOAD) if x.result == 0}
        stubs = {s.func: s.symbol for s in trace.of(R.Stub, Ev.STUB)}
        if not graphs:
            return cls(trace, allocs, events, [], {}, loads, [], {}, None, vmm)
        funcs = {
            f.func: Func(
                f.name,
                loads.get(f.library) or loads.get(f.module, ""),
                stubs.get(f.func, ""),
                [(int(p[0]), int(p[1])) for p in f.params],
            )
            for f in trace.of(R.Func, Ev.FUNC)
        }
        for fa in trace.of(R.FuncAttr, Ev.FUNC_ATTR):
            if fa.result == 0 and fa.func in funcs:
                funcs[fa.func].attrs[fa.attr] = fa.value
        glob = [
            (g.addr, g.size, loads.get(g.owner, ""), g.name, g.seq)
            for g in trace.of(R.Global, Ev.GLOBAL)
            if g.result == 0
        ]
        contents = {
            c.alloc_seq: (c.seq, c.data) for c in trace.of(R.Content, Ev.CONTENT) if c.result == 0
        }
        devs = trace.of(R.Device, Ev.DEVICE)
        return cls(
            trace,
            allocs,
            events,
            glob,
            funcs,
            loads,
            _graphs(trace),
            contents,
            devs[0] if devs else None,
            vmm,
        )


def _graphs(trace: Trace) -> list[dict]:
    """Successful captures, in order, with nodes (by index), edges, attributes and launch seqs."""
    launches = {x.node: x.seq for x in trace.of(R.Launch, Ev.LAUNCH) if x.node}
    nodes: dict[int, list[R.Node]] = defaultdict(list)
    for n in trace.of(R.Node, Ev.NODE):
        nodes[n.graph].append(n)
    edges: dict[int, list[R.Edge]] = defaultdict(list)
    for e in trace.of(R.Edge, Ev.EDGE):
        edges[e.graph].append(e)
    attrs: dict[int, list[R.NodeAttr]] = defaultdict(list)
    for a in trace.of(R.NodeAttr, Ev.NODE_ATTR):
        attrs[a.node].append(a)
    out = []
    for end in trace.of(R.CaptureEnd, Ev.CAPTURE_END):
        if end.result or not end.graph:
            continue
        ns = sorted(nodes[end.graph], key=lambda n: n.index)
        pos = {n.node: n.index for n in ns}
        out.append(
            {
                "seq": end.seq,
                "nodes": ns,
                "launch_seq": [launches.get(n.node, end.seq) for n in ns],
                "edges": sorted(
                    (pos[e.src], pos[e.dst], e.from_port, e.to_port, e.type)
                    for e in edges[end.graph]
                ),
                "attrs": [(pos[n.node], a.attr, a.value) for n in ns for a in attrs[n.node]],
            }
        )
    return out


class AddressIndex:
    """Which allocation (or module global) held an address at a given moment of one run."""

    def __init__(self, run: RunView) -> None:
        rows = [(a.addr, a.size, a.seq, a.free_seq, a.kind, a.index) for a in run.allocs]
        rows += [(g[0], g[1], g[4], NEVER, GLOBAL, i) for i, g in enumerate(run.globals)]
        rows += [(m[2], m[3], m[4], m[5], VMM, i) for i, m in enumerate(run.vmm)]
        self.start = np.array([r[0] for r in rows], dtype=np.uint64)
        self.end = self.start + np.array([r[1] for r in rows], dtype=np.uint64)
        self.seq = np.array([r[2] for r in rows], dtype=np.int64)
        self.free = np.array([r[3] for r in rows], dtype=np.int64)
        self.kind = [r[4] for r in rows]
        self.index = [r[5] for r in rows]

    def find(self, value: int, seq: int) -> tuple[int, int, int] | None:
        v = np.uint64(value)
        live = (self.seq < seq) & (self.free > seq)
        hit = np.flatnonzero(live & (self.start <= v) & (v < self.end))
        if not hit.size:  # one past the end is a pointer too, when nothing else holds it
            hit = np.flatnonzero(live & (self.end == v) & (self.end > self.start))
        if not hit.size:
            return None
        i = int(hit[np.argmax(self.seq[hit])])
        return self.kind[i], self.index[i], value - int(self.start[i])


Finder = Callable[[int], "tuple[int, int, int] | None"]


def relocate_words(
    a: bytes, b: bytes, find_a: Finder, find_b: Finder, where: str
) -> list[tuple[int, int, int, int]]:
    """(byte offset, kind, index, addend) for every word that is a pointer; raises on a word that
    changed between the runs without moving with an allocation."""
    if len(a) != len(b):
        raise MaterializeError(
            f"{where}: {len(a)} parameter bytes in one run, {len(b)} in the other"
        )
    n = len(a) // 8
    wa = np.frombuffer(a[: n * 8], "<u8")
    wb = np.frombuffer(b[: n * 8], "<u8")
    if a[n * 8 :] != b[n * 8 :]:
        raise MaterializeError(f"{where}: the last {len(a) - n * 8} bytes differ between the runs")
    out = []
    for w in np.flatnonzero(wa != wb).tolist():
        ra, rb = find_a(int(wa[w])), find_b(int(wb[w]))
        if ra is None or rb is None or ra != rb:
            raise MaterializeError(
                f"{where}, byte {8 * w}: {int(wa[w]):#x} in one run and {int(wb[w]):#x} in the "
                f"other, and they are not the same place in the same allocation "
                f"({_describe(ra)} vs {_describe(rb)})"
            )
        out.append((8 * w, *ra))
    return out


def _describe(r: tuple | None) -> str:
    return "no live allocation" if r is None else f"{KIND_NAMES[r[0]]} #{r[1]} + {r[2]}"
