"""One recording indexed for analysis: allocations by (phase, ordinal), kernels, module globals,
VMM reservations, captured graphs and saved contents; and the kinds of memory a relocation names
(the plan's relocation kinds: DEVICE, HOST, GLOBAL, VMM), which the offline analysis and the
online restore both use."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from medusa.trace import Ev, Trace, TraceError
from medusa.trace import records as R
from medusa.trace.captures import captures

DEVICE, HOST, GLOBAL, VMM = 0, 1, 2, 3
KIND_NAMES = ("device", "host-mapped", "module global", "vmm")
NEVER = np.iinfo(np.int64).max


@dataclass
class Alloc:
    index: int
    phase: str
    ordinal: int
    kind: int  # DEVICE or HOST (pinned, mapped or registered host memory)
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
    # (phase, ordinal, addr, size, reserve seq, free seq) of each cuMemAddressReserve. NOTE: a
    # pointer into VMM memory is relative to its reservation, not to a mapping: an elastic KV
    # cache's graphs point into pages that are mapped and unmapped as requests come and go, while
    # the reservation (what the restore re-reserves) stays for the process's lifetime.
    unsaved: set[int] = field(default_factory=set)  # alloc seqs the recorder could not snapshot

    @classmethod
    def build(cls, trace: Trace, *, graphs: bool = True) -> RunView:
        """Indexes a recording; graphs=False skips what only materialization needs."""
        allocs, events, vmm = _memory(trace)
        if trace.stopped:
            raise TraceError(f"{trace.path}: the recorder stopped early: {trace.stopped}")
        loads = trace.loaded_images()
        if not graphs:
            return cls(trace, allocs, events, [], {}, loads, [], {}, None, vmm)
        glob = [
            (g.addr, g.size, loads.get(g.owner, ""), g.name, g.seq)
            for g in trace.of(R.Global, Ev.GLOBAL)
            if g.result == 0
        ]
        snapshots = trace.of(R.Content, Ev.CONTENT)
        contents = {c.alloc_seq: (c.seq, c.data) for c in snapshots if c.result == 0}
        unsaved = {c.alloc_seq for c in snapshots if c.result != 0}
        devs = trace.of(R.Device, Ev.DEVICE)
        return cls(
            trace,
            allocs,
            events,
            glob,
            _funcs(trace, loads),
            loads,
            captures(trace),
            contents,
            devs[0] if devs else None,
            vmm,
            unsaved,
        )


Vmm = tuple[str, int, int, int, int, int]  # phase, ordinal, address, size, seq, free seq


def _memory(trace: Trace) -> tuple[list[Alloc], list[tuple[str, int]], list[Vmm]]:
    """The allocations (each numbered within its phase), the order they were made and freed in,
    and the VMM reservations, of a recording."""
    allocs: list[Alloc] = []
    events: list[tuple[str, int]] = []
    by_seq: dict[int, int] = {}
    phase, ordinals = "start", defaultdict[str, int](int)
    vmm: list[Vmm] = []
    vmm_ordinals: dict[str, int] = defaultdict(int)
    kinds = (Ev.MARK, Ev.ALLOC, Ev.FREE, Ev.HOST_ALLOC, Ev.HOST_REGISTER, Ev.HOST_FREE,
             Ev.VMM_RESERVE, Ev.VMM_FREE)  # fmt: skip
    for e in trace.events(*kinds):
        if isinstance(e, R.Mark):
            phase = e.phase
        elif isinstance(e, R.VmmReserve) and e.result == 0:
            vmm.append((phase, vmm_ordinals[phase], e.addr, e.size, e.seq, NEVER))
            vmm_ordinals[phase] += 1
        elif isinstance(e, R.VmmFree) and e.result == 0:
            for j, m in enumerate(vmm):
                if m[2] == e.addr and m[5] == NEVER:
                    vmm[j] = (*m[:5], e.seq)
        elif isinstance(e, R.Alloc | R.HostAlloc | R.HostRegister) and e.result == 0:
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
    return allocs, events, vmm


def _funcs(trace: Trace, loads: dict[int, str]) -> dict[int, Func]:
    """Every kernel the recording saw: its name, image, exported stub, layout and attributes."""
    stubs = {s.func: s.symbol for s in trace.of(R.Stub, Ev.STUB)}
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
    return funcs
