"""A recording's memory, read without a record object per event: its allocations (each numbered
within its phase), when each was freed, and its VMM reservations. The restore maps its plan onto
these lists as they are (a restore's cost is counted in microseconds, in a fresh process where
each numpy call costs tens of them the first time: one pass over plain lists is cheaper than a
dozen array operations for a few hundred records); RunView makes the analysis' objects of them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medusa.trace.format import RECORD_DTYPE, Ev
from medusa.trace.reader import Trace

DEVICE, HOST = 0, 1  # an allocation's kind (medusa.trace.run_view names all four)
NEVER = np.iinfo(np.int64).max
Vmm = tuple[str, int, int, int, int, int]  # phase, ordinal, address, size, seq, free seq

# NOTE: plain ints, not Ev members: an enum member costs a lookup each time it is named.
MARK, ALLOC, FREE, HOST_ALLOC, HOST_FREE, HOST_REGISTER, VMM_RESERVE, VMM_FREE = map(
    int,
    (Ev.MARK, Ev.ALLOC, Ev.FREE, Ev.HOST_ALLOC, Ev.HOST_FREE, Ev.HOST_REGISTER, Ev.VMM_RESERVE,
     Ev.VMM_FREE),
)  # fmt: skip
_MEMORY = np.zeros(max(map(int, Ev)) + 1, bool)  # the record types read here
_MEMORY[[MARK, ALLOC, FREE, HOST_ALLOC, HOST_FREE, HOST_REGISTER, VMM_RESERVE, VMM_FREE]] = True
_RAW = np.dtype((np.void, RECORD_DTYPE.itemsize))


@dataclass(frozen=True)
class Memory:
    """Item i of each list is allocation i, in the order the recording made them (successful
    calls only); a phase is an index into `phases`."""

    phases: list[str]  # each phase name once, "start" first
    phase: list[int]
    ordinal: list[int]  # its number among its phase's allocations
    kind: list[int]  # DEVICE or HOST (pinned, mapped or registered host memory)
    size: list[int]
    addr: list[int]  # the device-visible address
    api: list[int]  # the api number (Trace.api_name)
    seq: list[int]
    free_seq: list[int]  # the last free that names it, NEVER if none
    events: list[tuple[str, int]]  # ("a" | "f", allocation), in order
    vmm: list[Vmm]
    count: dict[str, int]  # allocations per phase
    index: dict[tuple[str, int], int]  # (phase, ordinal) -> allocation

    def __len__(self) -> int:
        return len(self.seq)

    def names(self) -> list[str]:
        """Each allocation's phase name."""
        return list(map(self.phases.__getitem__, self.phase))


def _mark(trace: Trace, blob: int) -> str:
    return trace.blob(blob).decode("utf-8", "replace")


def phase_names(trace: Trace) -> list[str]:
    """The phases a recording marked, each once, in order; "start" (before any mark) first."""
    blobs = trace.records["blob"][trace.records["type"] == MARK].tolist()
    return list(dict.fromkeys(["start", *(_mark(trace, b) for b in blobs)]))


def _vmm(vmm: list[Vmm], phase: str, free: bool, addr: int, size: int, seq: int) -> None:
    """A reservation, or a free of every live one at its address (as the driver: one)."""
    if not free:
        ordinal = sum(1 for m in vmm if m[0] == phase)
        vmm.append((phase, ordinal, addr, size, seq, NEVER))
        return
    for j, m in enumerate(vmm):
        if m[2] == addr and m[5] == NEVER:
            vmm[j] = (*m[:5], seq)


def memory(trace: Trace) -> Memory:
    """The recording's memory. A free counts when it names (by sequence number) an allocation
    made before it, whatever its result."""
    # NOTE: copied as opaque records: a structured copy goes field by field, five times slower.
    rows = trace.records.view(_RAW)[_MEMORY[trace.records["type"]]].view(RECORD_DTYPE)
    u = rows["u"]
    columns = (rows["type"], rows["result"], rows["seq"], rows["blob"], rows["api"], u[:, 0],
               u[:, 1], u[:, 3])  # fmt: skip
    cols = zip(*(c.tolist() for c in columns), strict=True)
    ids = {"start": 0}
    m = Memory(["start"], [], [], [], [], [], [], [], [], [], [], {}, {})
    counts = [0]  # allocations so far, per phase
    by_seq: dict[int, int] = {}
    cur = 0
    for t, result, seq, blob, api, w0, w1, w3 in cols:
        if t == MARK:
            name = _mark(trace, blob)
            if (cur := ids.setdefault(name, len(ids))) == len(counts):
                m.phases.append(name)
                counts.append(0)
        elif t == FREE or t == HOST_FREE:  # u[3]: the allocation's sequence number
            if (i := by_seq.get(w3)) is not None:
                m.free_seq[i] = seq
                m.events.append(("f", i))
        elif result:
            continue
        elif t == VMM_RESERVE or t == VMM_FREE:
            _vmm(m.vmm, m.phases[cur], t == VMM_FREE, w0, w1, seq)
        else:
            by_seq[seq] = i = len(m.seq)
            m.events.append(("a", i))
            m.index[(m.phases[cur], counts[cur])] = i
            m.phase.append(cur)
            m.ordinal.append(counts[cur])
            counts[cur] += 1
            device = t == ALLOC
            m.kind.append(DEVICE if device else HOST)
            m.size.append(w1)
            # A host allocation's device-visible address: its mapping's, else the host pointer.
            m.addr.append(w0 if device else w3 or w0)
            m.api.append(api)
            m.seq.append(seq)
            m.free_seq.append(NEVER)
    m.count.update(zip(m.phases, counts, strict=True))
    return m
