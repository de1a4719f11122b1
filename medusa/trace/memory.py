"""A recording's memory as columns, read with numpy rather than a record object per event: its
allocations (each numbered within its phase), when each was freed, and its VMM reservations.
The restore maps its plan onto these columns as they are (a restore's cost is counted in
microseconds); RunView turns them into the objects the analysis works with."""

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
_ROLE = np.zeros(max(map(int, Ev)) + 1, np.int8)  # 1: allocates, 2: frees, 3: VMM, 4: a mark
_ROLE[[ALLOC, HOST_ALLOC, HOST_REGISTER]] = 1
_ROLE[[FREE, HOST_FREE]] = 2
_ROLE[[VMM_RESERVE, VMM_FREE]] = 3
_ROLE[MARK] = 4
_RAW = np.dtype((np.void, RECORD_DTYPE.itemsize))


@dataclass(frozen=True)
class Memory:
    """Column i of each array is allocation i, in the order the recording made them (successful
    calls only); a phase is an index into `phases`."""

    phases: list[str]  # each phase name once, "start" first
    phase: np.ndarray  # int64
    ordinal: np.ndarray  # int64: its number among its phase's allocations
    kind: np.ndarray  # int64: DEVICE or HOST (pinned, mapped or registered host memory)
    size: np.ndarray  # uint64
    addr: np.ndarray  # uint64: the device-visible address
    api: np.ndarray  # the api number (Trace.api_name)
    seq: np.ndarray  # uint64
    freed: np.ndarray  # bool: a later free names it
    free_seq: np.ndarray  # uint64: the last such free's seq (0 where none)
    vmm: list[Vmm]
    order: tuple[np.ndarray, np.ndarray, np.ndarray]  # rows of allocations, of frees, and what
    # each free frees

    @property
    def events(self) -> list[tuple[str, int]]:
        """("a" | "f", allocation), in the order the recording made and freed them."""
        at, f_at, freed = self.order
        events = [("a", i) for i in range(len(at))]
        if len(f_at):
            events += [("f", i) for i in freed.tolist()]
            order = np.argsort(np.concatenate([at, f_at]), kind="stable").tolist()
            events = [events[k] for k in order]
        return events

    def __len__(self) -> int:
        return len(self.seq)

    def names(self) -> list[str]:
        """Each allocation's phase name."""
        return list(map(self.phases.__getitem__, self.phase.tolist()))


def _marks(trace: Trace, blobs: np.ndarray) -> list[str]:
    return [trace.blob(o).decode("utf-8", "replace") for o in blobs.tolist()]


def phase_names(trace: Trace) -> list[str]:
    """The phases a recording marked, each once, in order; "start" (before any mark) first."""
    rows = trace.records["type"] == MARK
    return list(dict.fromkeys(["start", *_marks(trace, trace.records["blob"][rows])]))


def _phases(trace: Trace, blobs: np.ndarray, is_mark: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The phase names, and each row's phase (the last MARK at or before it; "start" before any)."""
    ids: dict[str, int] = {"start": 0}
    marked = [ids.setdefault(m, len(ids)) for m in _marks(trace, blobs[is_mark])]
    return list(ids), np.array([0, *marked], np.int64)[np.cumsum(is_mark)]


def _ordinals(phase: np.ndarray, num_phases: int) -> np.ndarray:
    """Each entry's number among the earlier entries of its phase."""
    counts = np.bincount(phase, minlength=num_phases)
    order = np.argsort(phase, kind="stable")
    out = np.empty(len(phase), np.int64)
    out[order] = np.arange(len(phase)) - np.repeat(np.cumsum(counts) - counts, counts)
    return out


def _frees(rows: np.ndarray, f_at: np.ndarray, at: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """For each free row, the allocation it frees: u[3] names its sequence number, which must be
    an earlier allocation's; -1 where none."""
    named = rows["u"][f_at, 3]
    j = np.searchsorted(seq, named)
    jc = np.minimum(j, len(seq) - 1)
    return np.where((j < len(seq)) & (seq[jc] == named) & (at[jc] < f_at), j, -1)


def _vmm(rows: np.ndarray, at: np.ndarray, phase: np.ndarray, phases: list[str]) -> list[Vmm]:
    """The reservations (few: a loop), each freed by the first successful free of its address."""
    out: list[Vmm] = []
    ordinals: dict[str, int] = {}
    for i in at.tolist():
        r = rows[i]
        if int(r["result"]) != 0:
            continue
        addr, seq = int(r["u"][0]), int(r["seq"])
        if int(r["type"]) == VMM_RESERVE:
            name = phases[int(phase[i])]
            out.append((name, ordinals.get(name, 0), addr, int(r["u"][1]), seq, NEVER))
            ordinals[name] = ordinals.get(name, 0) + 1
            continue
        for j, m in enumerate(out):
            if m[2] == addr and m[5] == NEVER:
                out[j] = (*m[:5], seq)
    return out


def _take(rows: np.ndarray, which: np.ndarray) -> np.ndarray:
    # NOTE: copied as opaque records: a structured copy goes field by field, five times slower.
    return rows.view(_RAW)[which].view(RECORD_DTYPE)


def memory(trace: Trace) -> Memory:
    """The recording's memory. A free counts when it names (by sequence number) an allocation
    made before it, whatever its result."""
    role = _ROLE[trace.records["type"]]
    rows = _take(trace.records, role != 0)
    role = role[role != 0]
    phases, phase = _phases(trace, rows["blob"], role == 4)
    at = np.flatnonzero((role == 1) & (rows["result"] == 0))
    a = _take(rows, at)
    au, seq = a["u"], a["seq"]
    device = a["type"] == ALLOC
    # A host allocation's device-visible address: its mapping's, else the host pointer itself.
    addr = np.where(device | (au[:, 3] == 0), au[:, 0], au[:, 3])
    f_at = np.flatnonzero(role == 2)
    j = _frees(rows, f_at, at, seq) if len(f_at) and len(seq) else np.zeros(0, np.int64)
    f_at, j = f_at[j >= 0], j[j >= 0]
    free_seq = np.zeros(len(seq), np.uint64)
    np.maximum.at(free_seq, j, rows["seq"][f_at])  # frees come in order: the last one's
    freed = np.zeros(len(seq), bool)
    freed[j] = True
    return Memory(
        phases,
        phase[at],
        _ordinals(phase[at], len(phases)),
        np.where(device, DEVICE, HOST),
        au[:, 1],
        addr,
        a["api"],
        seq,
        freed,
        free_seq,
        _vmm(rows, np.flatnonzero(role == 3), phase, phases),
        (at, f_at, j),
    )
