"""From two recordings of one start-up (the second with the device address layout shifted) to a
restore plan: allocations by (phase, ordinal), kernels by (image hash, name), and every graph with
each 8-byte parameter word either a constant or a relocation (kind, index, offset).

Nothing here knows a kernel: a word is a pointer exactly when it moves with its allocation between
the two recordings, and it points where the allocation history at that moment says. A kernel word
that differs but lies outside all device memory of both runs is a host value (a closure's pointer
the kernel never reads) and is kept as recorded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from medusa.errors import RefusedError
from medusa.trace.run_view import DEVICE, GLOBAL, HOST, KIND_NAMES, NEVER, VMM, RunView


class MaterializeError(RefusedError, ValueError):
    """The two recordings disagree, or a graph uses something that cannot be restored."""


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
        device = [(r[0], r[0] + r[1]) for r in rows if r[4] != HOST]
        # every device address the run was ever given (allocations, reservations, globals)
        self.span = (min(d[0] for d in device), max(d[1] for d in device)) if device else (0, 0)

    def outside(self, value: int) -> bool:
        """True when VALUE lies outside all device memory of the run: no pointer into, or
        between, any allocation, reservation or global the recorder saw."""
        lo, hi = self.span
        return value < lo or value > hi

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

    def at(self, seq: int) -> Locator:
        return Locator(self, seq)


class Locator:
    """find() at one moment, plus a vectorized test that rules out most words of a buffer at
    once (stale bytes hold no address), so a large saved buffer is not searched word by word."""

    def __init__(self, index: AddressIndex, seq: int) -> None:
        self.index, self.seq = index, seq
        live = (index.seq < seq) & (index.free > seq)
        order = np.argsort(index.start[live], kind="stable")
        self.lo = index.start[live][order]
        self.reach = np.maximum.accumulate(index.end[live][order]) if self.lo.size else self.lo

    def __call__(self, value: int) -> tuple[int, int, int] | None:
        return self.index.find(value, self.seq)

    def maybe(self, values: np.ndarray) -> np.ndarray:
        """False where no live allocation holds the value (nor ends at it)."""
        if not self.lo.size:
            return np.zeros(values.shape, bool)
        j = np.searchsorted(self.lo, values, side="right") - 1
        return (j >= 0) & (self.reach[np.maximum(j, 0)] >= values)


Finder = Callable[[int], "tuple[int, int, int] | None"]


class Unmoved:
    """Allocations at the same address in both runs. A word pointing into one of them is the
    same in both runs, so the diff cannot tell it from a constant: such a word is refused."""

    def __init__(self, a: RunView, b: RunView) -> None:
        pairs = [(x, y) for x, y in zip(a.allocs, b.allocs, strict=False) if x.addr == y.addr]
        self.kind_index = {(x.kind, x.index) for x, _ in pairs}
        ranges = [(x.addr, x.addr + x.size) for x, _ in pairs]
        for i, (m, mb) in enumerate(zip(a.vmm, b.vmm, strict=False)):
            if m[2] == mb[2]:
                self.kind_index.add((VMM, i))
                ranges.append((m[2], m[2] + m[3]))
        ranges.sort()
        self.lo = np.array([r[0] for r in ranges], np.uint64)
        self.reach = np.maximum.accumulate(np.array([r[1] for r in ranges], np.uint64))

    def check(self, words: np.ndarray, offsets: np.ndarray, find: Finder, where: str) -> None:
        """Raises if any of WORDS (equal in both runs) points into an unmoved allocation."""
        if not self.lo.size or not words.size:
            return
        j = np.searchsorted(self.lo, words, side="right") - 1
        near = (j >= 0) & (words <= self.reach[np.maximum(j, 0)])
        for w, off in zip(words[near].tolist(), offsets[near].tolist(), strict=True):
            r = find(int(w))
            if r is not None and (r[0], r[1]) in self.kind_index:
                why = (
                    "host memory moves between runs only with address-space randomization "
                    "(/proc/sys/kernel/randomize_va_space)"
                    if r[0] == HOST
                    else "the second recording's address shift did not move it (was "
                    "MEDUSA_TRACE_SHIFT unset, or the memory made before the recorder loaded?)"
                )
                raise MaterializeError(
                    f"{where}, byte {off}: {int(w):#x} points into {_describe(r)}, which sat at "
                    f"the same address in both recordings, so it cannot be told from a constant: "
                    f"{why}"
                )


Foreign = Callable[[int, int], bool]


@dataclass(frozen=True)
class Scale:
    """Device allocations whose size follows a count (the KV cache's blocks) that the second
    recording was made with at another value. A word pointing into one of them at offset c in
    one run and c + s x (count_b - count_a) in the other is a pointer whose offset grows by s
    bytes per unit of the count (vLLM's value cache sits after a key cache of num_blocks pages):
    a restore with another count moves it by s x the difference. Kernel-agnostic like every
    relocation: nothing here knows what the allocation holds."""

    allocs: frozenset[int]
    count_a: int
    count_b: int

    def slope(self, ra: tuple[int, int, int] | None, rb: tuple[int, int, int] | None) -> int | None:
        """Bytes per unit of the count, when RA and RB are one scaled allocation at offsets
        that differ by a whole multiple of the counts' difference; else None."""
        if ra is None or rb is None or ra[:2] != rb[:2] or ra[0] != DEVICE:
            return None
        if ra[1] not in self.allocs or self.count_a == self.count_b:
            return None
        q, r = divmod(rb[2] - ra[2], self.count_b - self.count_a)
        return q if r == 0 else None


Keep = Callable[[int, int, int], bool]  # (word index, value a, value b): kept as recorded
HOST_FLOOR = 1 << 22  # no Linux x86-64 program maps below 4 MiB: smaller values are scalars


def _closure_words(foreign: Foreign | None, layout: Sequence[tuple[int, int]]) -> Keep | None:
    """Which differing words may be a by-value closure's host pointer (PyTorch's elementwise
    lambdas hold one the kernel never reads): a whole 8-byte parameter, a host-sized value."""
    whole = {o // 8 for o, size in layout if size == 8 and o % 8 == 0}
    if foreign is None or not whole:
        return None
    return lambda w, va, vb: w in whole and min(va, vb) >= HOST_FLOOR and foreign(va, vb)


def outside_both(ia: AddressIndex, ib: AddressIndex) -> Foreign:
    """A word that is no device address in either run: outside all device memory of both."""
    return lambda va, vb: ia.outside(va) and ib.outside(vb)


def relocate_words(
    a: bytes,
    b: bytes,
    find_a: Finder,
    find_b: Finder,
    where: str,
    unmoved: Unmoved | None = None,
    *,
    foreign: Foreign | None = None,
    layout: Sequence[tuple[int, int]] = (),
    scale: Scale | None = None,
) -> list[tuple[int, ...]]:
    """(byte offset, kind, index, addend) for every word that is a pointer; raises on a word that
    changed between the runs without moving with an allocation (parameters hold no stale bytes),
    unless it is a whole 8-byte parameter of LAYOUT ((offset, size) per kernel parameter, which
    also names the parameter in an error) holding a host address in both runs (at least
    HOST_FLOOR, and FOREIGN(value a, value b): no device address): such a word is kept as
    recorded. A scalar (a count, a length, a seed) that differs is still refused. With SCALE, a
    pointer whose offset follows the count is a 5-tuple, its slope last."""
    keep = _closure_words(foreign, layout)
    relocs, num_stale, first = _diff_words(a, b, find_a, find_b, where, unmoved, keep, scale)
    if first is not None:
        w, va, vb, ra, rb = first
        raise MaterializeError(
            f"{where}, byte {8 * w}{_param_of(8 * w, layout)}: {va:#x} in one run and {vb:#x} in "
            f"the other, and they are not the same place in the same allocation "
            f"({_describe(ra)} vs {_describe(rb)})"
        )
    if len(a) % 8 and a[-(len(a) % 8) :] != b[-(len(b) % 8) :]:
        raise MaterializeError(f"{where}: the last {len(a) % 8} bytes differ between the runs")
    return relocs


def relocate_contents(
    a: bytes,
    b: bytes,
    find_a: Finder,
    find_b: Finder,
    where: str,
    unmoved: Unmoved | None,
    scale: Scale | None = None,
) -> tuple[list[tuple[int, ...]], int]:
    """Saved buffer contents: (relocations, number of stale words). Device memory is not cleared,
    so a word may differ between the runs because it holds what the last user left (stale bytes
    differ per process): such a word is kept as recorded. A word that points into the same
    allocation at the same offset in both runs is a pointer. One whose offset follows SCALE's
    count is refused: saved contents are written as recorded, not rescaled."""
    relocs, num_stale, _ = _diff_words(a, b, find_a, find_b, where, unmoved, None, scale)
    for r in relocs:
        if len(r) > 4:
            raise MaterializeError(
                f"{where}, byte {r[0]}: a pointer into allocation #{r[2]} whose offset follows "
                "the KV cache's size; saved contents cannot follow it: materialize with "
                "the KV size fixed"
            )
    return relocs, num_stale


def _diff_words(
    a: bytes,
    b: bytes,
    find_a: Finder,
    find_b: Finder,
    where: str,
    unmoved: Unmoved | None,
    keep: Keep | None = None,
    scale: Scale | None = None,
) -> tuple[list[tuple[int, ...]], int, tuple | None]:
    if len(a) != len(b):
        raise MaterializeError(f"{where}: {len(a)} bytes in one run, {len(b)} in the other")
    n = len(a) // 8
    wa = np.frombuffer(a[: n * 8], "<u8")
    wb = np.frombuffer(b[: n * 8], "<u8")
    differ = wa != wb
    if unmoved is not None:
        same = np.flatnonzero(~differ)
        unmoved.check(wa[same], 8 * same, find_a, where)
    relocs: list[tuple[int, ...]] = []
    num_stale = 0
    first: tuple | None = None
    idx = np.flatnonzero(differ)
    maybe_a, maybe_b = getattr(find_a, "maybe", None), getattr(find_b, "maybe", None)
    if maybe_a is not None and maybe_b is not None and idx.size and keep is None:
        cand = maybe_a(wa[idx]) & maybe_b(wb[idx])
        if not cand.all():
            w = int(idx[~cand][0])
            num_stale, first = int((~cand).sum()), (w, int(wa[w]), int(wb[w]), None, None)
        idx = idx[cand]
    for w in idx.tolist():
        va, vb = int(wa[w]), int(wb[w])
        ra, rb = find_a(va), find_b(vb)
        if ra is None and rb is None and keep is not None and keep(w, va, vb):
            continue  # NOTE: no device address in either run (a closure's host pointer): kept
        if ra is not None and ra == rb:
            relocs.append((8 * w, *ra))
        elif scale is not None and (slope := scale.slope(ra, rb)) is not None:
            relocs.append((8 * w, *ra, slope))  # type: ignore[misc]
        else:
            num_stale += 1
            first = first or (w, va, vb, ra, rb)
    return relocs, num_stale, first


def _param_of(offset: int, layout: Sequence[tuple[int, int]]) -> str:
    """ " (parameter i of n: s bytes at offset o)" for the parameters the 8-byte word overlaps."""
    hit = [i for i, (o, s) in enumerate(layout) if o < offset + 8 and offset < o + s]
    if not hit:
        return ""
    parts = ", ".join(f"{i} ({layout[i][1]} bytes at offset {layout[i][0]})" for i in hit)
    return f", in parameter {parts} of {len(layout)}"


def _describe(r: tuple | None) -> str:
    return "no live allocation" if r is None else f"{KIND_NAMES[r[0]]} #{r[1]} + {r[2]}"
