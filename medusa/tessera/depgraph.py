"""The dependency graph of one captured graph: read-after-write edges from a last-writer registry
over its nodes in capture order, buffers carried across iterations (state to replicate, with the
writes as deltas), and kernels pinned together because they reach memory indirectly.

NOTE: a write counts as a read too (the writer depends on the last writer of what it writes).
Accesses are page-granular, so a kernel may be said to write bytes it did not; pulling the page
first keeps a transfer of the whole page correct, and a read hidden behind a first write to a
page (simcuda records that page as written only) is still ordered."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from medusa.tessera.accesses import READ, WRITE, Key

Extents = dict[Key, list[tuple[int, int, int]]]


@dataclass
class DepGraph:
    num_nodes: int
    edges: dict[tuple[int, int], int]  # (producer, consumer) -> bytes that must flow
    state: set[Key]  # read before written in an iteration, and written: carried across steps
    pinned: list[set[int]]  # groups of nodes that must share a device
    inputs: set[Key] = field(default_factory=set)  # read, never written by the graph
    outputs: set[Key] = field(default_factory=set)  # written, never read after by the graph


class LastWriter:
    """Per allocation, disjoint byte ranges with the node that wrote them last."""

    def __init__(self) -> None:
        self.segs: dict[Key, list[tuple[int, int, int]]] = defaultdict(list)

    def overlaps(self, key: Key, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(lo, hi, writer) of the written ranges within [lo, hi)."""
        return [(max(a, lo), min(b, hi), w) for a, b, w in self.segs[key] if a < hi and b > lo]

    def readers_of(self, key: Key, lo: int, hi: int) -> list[tuple[int, int]]:
        """(writer, overlapping bytes) of [lo, hi)."""
        return [(w, b - a) for a, b, w in self.overlaps(key, lo, hi)]

    def covered(self, key: Key, lo: int, hi: int) -> int:
        return sum(n for _, n in self.readers_of(key, lo, hi))

    def write(self, key: Key, lo: int, hi: int, node: int) -> None:
        kept = []
        for a, b, w in self.segs[key]:
            if b <= lo or a >= hi:
                kept.append((a, b, w))
                continue
            if a < lo:
                kept.append((a, lo, w))
            if b > hi:
                kept.append((hi, b, w))
        kept.append((lo, hi, node))
        self.segs[key] = sorted(kept)


def build(accesses: Sequence[Extents | None], indirect: list[set[Key]] | None = None) -> DepGraph:
    """accesses[i]: node i's extents (kernels from the access analysis, copies by their API
    semantics); None for a node that touches no memory."""
    reg = LastWriter()
    edges: dict[tuple[int, int], int] = defaultdict(int)
    exposed: dict[Key, int] = defaultdict(int)  # bytes read before any write this iteration
    written: set[Key] = set()
    read_after: dict[Key, bool] = defaultdict(bool)
    read_keys: set[Key] = set()
    for i, ext in enumerate(accesses):
        for key, ranges in (ext or {}).items():
            for lo, hi, mode in ranges:
                for w, n in reg.readers_of(key, lo, hi):
                    if w != i:
                        edges[(w, i)] += n
                if mode & READ:
                    read_keys.add(key)
                    exposed[key] += (hi - lo) - reg.covered(key, lo, hi)
                    read_after[key] |= key in written
        for key, ranges in (ext or {}).items():
            for lo, hi, mode in ranges:
                if mode & WRITE:
                    reg.write(key, lo, hi, i)
                    written.add(key)
    state = {k for k in written if exposed[k] > 0}
    groups: list[set[int]] = []
    if indirect:
        # Kernels that reach memory through pointers held in memory stay with that memory's writers.
        reach = {k for ks in indirect for k in ks}
        members = {i for i, ks in enumerate(indirect) if ks}
        members |= {
            i
            for i, ext in enumerate(accesses)
            if ext and any(k in reach and any(m & WRITE for _, _, m in ext[k]) for k in ext)
        }
        if len(members) > 1:
            groups.append(members)
    return DepGraph(
        len(accesses),
        dict(edges),
        state,
        groups,
        inputs=read_keys - written,
        outputs={k for k in written if not read_after[k]},
    )
