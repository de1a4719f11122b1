"""A restore plan's tables once checked (medusa.restore.validate): what a relocation of each kind
may point into, and what graphs and saved contents may index (medusa.restore.graph_check)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medusa.artifact.errors import ArtifactError
from medusa.trace.run_view import DEVICE, HOST


@dataclass(frozen=True)
class Targets:
    """What a relocation of each kind may point into: a recorded size per index, -1 for none."""

    sizes: np.ndarray  # the four kinds' tables, one after the other
    start: np.ndarray  # where each kind's table begins in sizes
    count: np.ndarray  # its length

    @classmethod
    def of(cls, kind: np.ndarray, size: np.ndarray, globs: np.ndarray, vmm: np.ndarray) -> Targets:
        tables = [np.where(kind == DEVICE, size, -1), np.where(kind == HOST, size, -1), globs, vmm]
        count = np.array([len(t) for t in tables], np.int64)
        start = np.concatenate([[0], np.cumsum(count)[:-1]])
        return cls(np.concatenate(tables).astype(np.int64), start, count)

    def room(self, kind: np.ndarray, target: np.ndarray, addend: np.ndarray) -> np.ndarray:
        """Bytes from each relocated pointer to the end of what it points into; -1 where the
        relocation names no allocation of its kind or points outside it."""
        kind = kind.astype(np.int64)
        ok = (kind >= 0) & (kind < len(self.count))
        k = np.where(ok, kind, 0)
        ok &= target.astype(np.uint64) < self.count[k].astype(np.uint64)
        pos = np.where(ok, self.start[k] + np.where(ok, target, 0).astype(np.int64), 0)
        size = self.sizes[pos] if len(self.sizes) else np.full(len(kind), -1, np.int64)
        addend = addend.astype(np.int64)
        ok &= (size >= 0) & (addend >= 0) & (addend <= size)
        return np.where(ok, size - addend, -1)

    def check(self, relocs: np.ndarray, where: str) -> np.ndarray:
        """room() for relocation records, raising for the first that points at nothing."""
        room = self.room(relocs["kind"], relocs["target"], relocs["addend"])
        bad = np.flatnonzero(room < 0)
        if bad.size:
            r = relocs[bad[0]]
            raise ArtifactError(
                f"{where}, relocation {bad[0]}: kind {r['kind']} #{r['target']} + {r['addend']} "
                "is not inside an allocation of that kind the plan declares"
            )
        return room


@dataclass(frozen=True)
class PlanTables:
    """The plan's tables, checked: what graphs and contents may index."""

    targets: Targets
    num_funcs: int
    layout_end: np.ndarray  # per kernel: where its last recorded parameter ends; -1: none recorded
    live_replayed: np.ndarray  # per allocation: the restorer allocates it and it stays allocated
    alloc_size: np.ndarray
