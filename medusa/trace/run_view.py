"""One recording indexed for analysis: allocations by (phase, ordinal), kernels, module globals,
VMM reservations, captured graphs and saved contents; and the kinds of memory a relocation names
(the plan's relocation kinds: DEVICE, HOST, GLOBAL, VMM), which the offline analysis and the
online restore both use."""

from __future__ import annotations

from dataclasses import dataclass, field

from medusa.trace import Ev, Trace, TraceError
from medusa.trace import records as R
from medusa.trace.captures import captures
from medusa.trace.memory import DEVICE, HOST, NEVER, Vmm, memory

__all__ = ["DEVICE", "GLOBAL", "HOST", "KIND_NAMES", "NEVER", "VMM", "Alloc", "Func", "RunView"]

GLOBAL, VMM = 2, 3  # after DEVICE and HOST (medusa.trace.memory)
KIND_NAMES = ("device", "host-mapped", "module global", "vmm")


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


def _memory(trace: Trace) -> tuple[list[Alloc], list[tuple[str, int]], list[Vmm]]:
    """The allocations (each numbered within its phase), the order they were made and freed in,
    and the VMM reservations, of a recording."""
    m = memory(trace)
    names = {a: trace.api_name(a) for a in set(m.api)}
    allocs = list(
        map(Alloc, range(len(m)), m.names(), m.ordinal, m.kind, m.size,
            map(names.__getitem__, m.api), m.addr, m.seq, m.free_seq)
    )  # fmt: skip
    return allocs, m.events, m.vmm


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
