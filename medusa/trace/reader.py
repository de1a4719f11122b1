"""Reads a trace written by libmedusa_interpose.so: validated numpy views, typed records."""

from __future__ import annotations

import gc
import operator
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from medusa.trace import records as R
from medusa.trace.format import (
    BLOB_MAGIC,
    HEADER_DTYPE,
    HEADER_SIZE,
    MAGIC,
    RECORD_DTYPE,
    RECORD_SIZE,
    VERSION,
    Ev,
    Mode,
)

E = TypeVar("E", bound=R.Event)


class TraceError(ValueError):
    """A trace that cannot be read as it is; the message names the file, the offset and the fix."""


@dataclass(frozen=True)
class Trace:
    path: Path
    pid: int
    mode: Mode
    start_unix_ns: int
    records: np.ndarray  # RECORD_DTYPE, in file order (= sequence order)
    blobs: bytes
    apis: tuple[str, ...]
    complete: bool  # the recording process exited cleanly (an END record is last)

    @property
    def images_dir(self) -> Path:
        return self.path.with_name(self.path.name + ".images")

    def image(self, sha256: str) -> bytes | None:
        p = self.images_dir / f"{sha256}.img"
        return p.read_bytes() if p.exists() else None

    def __len__(self) -> int:
        return len(self.records)

    def api_name(self, api: int) -> str:
        return self.apis[api] if api < len(self.apis) else f"api#{api}"

    def blob(self, offset: int) -> bytes:
        if not offset:
            return b""
        (n,) = struct.unpack_from("<I", self.blobs, offset)
        return self.blobs[offset + 4 : offset + 4 + n]

    def select(self, *types: Ev) -> np.ndarray:
        """The raw records of the given types (all of them when none are given)."""
        if not types:
            return self.records
        return self.records[np.isin(self.records["type"], [int(t) for t in types])]

    def events(self, *types: Ev) -> Iterator[R.Event]:
        """Typed records, in order; only the given types when some are given."""
        rows = self.select(*types)
        kinds = rows["type"]
        # Built a type at a time, from only the columns that type uses: converting every u64
        # word of every record to a Python int would cost more than building the records.
        # NOTE: the collector is off meanwhile: millions of new objects, none of them garbage,
        # would otherwise trigger collections that take longer than the building itself.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            # NOTE: bincount, not np.unique: the first np.unique in a process imports numpy.ma
            # (~13 ms), a visible share of a restore's cost.
            present = np.flatnonzero(np.bincount(kinds)).tolist() if len(kinds) else []
            if not present:
                return iter([])
            if len(present) == 1:
                return iter(self._build(present[0], rows))
            built: list[R.Event] = []
            where = []
            for t in present:
                idx = np.flatnonzero(kinds == t)
                built += self._build(t, rows[idx])
                where.append(idx)
            # Back into file order without a Python loop: gather by the inverse permutation.
            order = np.argsort(np.concatenate(where), kind="stable")
            return iter(operator.itemgetter(*order.tolist())(built) if len(order) > 1 else built)
        finally:
            if was_enabled:
                gc.enable()

    def _blobs_of(self, rows: np.ndarray) -> list[bytes]:
        offs = rows["blob"].astype(np.int64)
        words = np.frombuffer(self.blobs, "<u4", count=len(self.blobs) // 4)
        lens = np.where(offs > 0, words[offs // 4] if words.size else 0, 0)
        b = self.blobs
        return [
            b[o + 4 : o + 4 + n] if n else b""
            for o, n in zip(offs.tolist(), lens.tolist(), strict=True)
        ]

    def _heads(self, rows: np.ndarray) -> list[list]:
        """The common fields as columns: seq, api name, result, t_ns."""
        apis = self.apis
        names = [
            apis[a] if a < len(apis) else f"api#{a}" for a in range(int(rows["api"].max()) + 1)
        ]
        return [
            rows["seq"].tolist(),
            list(map(names.__getitem__, rows["api"].tolist())),
            rows["result"].tolist(),
            rows["t_ns"].tolist(),
        ]

    def _build(self, t: int, rows: np.ndarray) -> list[R.Event]:
        heads = self._heads(rows)
        u = rows["u"]
        simple = R.SIMPLE.get(t)
        if simple is not None:
            cls, words = simple
            return list(map(cls, *heads, *(u[:, w].tolist() for w in words)))
        if t == Ev.LAUNCH:
            lo, hi = u[:, 3:6] & 0xFFFFFFFF, u[:, 3:6] >> 32
            grid = zip(lo[:, 0].tolist(), hi[:, 0].tolist(), lo[:, 1].tolist(), strict=True)
            block = zip(hi[:, 1].tolist(), lo[:, 2].tolist(), hi[:, 2].tolist(), strict=True)
            cols = [u[:, w].tolist() for w in (0, 1, 2)]
            return list(
                map(R.Launch, *heads, *cols, grid, block, u[:, 6].tolist(), self._blobs_of(rows))
            )
        build = R.BUILDERS[t]
        rows_of_heads = zip(*heads, strict=True)
        return [
            build(h, w, blob)
            for h, w, blob in zip(rows_of_heads, u.tolist(), self._blobs_of(rows), strict=True)
        ]

    def of(self, cls: type[E], *types: Ev) -> list[E]:
        """Typed records of one class, e.g. trace.of(Alloc, Ev.ALLOC)."""
        return [e for e in self.events(*types) if isinstance(e, cls)]


def _check_header(path: Path, raw: bytes) -> np.void:
    if len(raw) < HEADER_SIZE:
        raise TraceError(
            f"{path}: {len(raw)} bytes is too short for a trace header ({HEADER_SIZE})"
        )
    h = np.frombuffer(raw[:HEADER_SIZE], HEADER_DTYPE)[0]
    if bytes(h["magic"]) != MAGIC:
        raise TraceError(
            f"{path}: not a Medusa trace (starts with {raw[:8]!r}, expected {MAGIC!r}); "
            "pass the file MEDUSA_TRACE named, not its .blobs side file"
        )
    if int(h["version"]) != VERSION:
        raise TraceError(
            f"{path}: trace format version {int(h['version'])}, this medusa reads version "
            f"{VERSION}; record it again with this build"
        )
    if int(h["record_size"]) != RECORD_SIZE or int(h["header_size"]) != HEADER_SIZE:
        raise TraceError(f"{path}: record size {int(h['record_size'])}, expected {RECORD_SIZE}")
    return h


def read_trace(path: str | Path, *, allow_truncated: bool = False) -> Trace:
    """Reads and validates a trace. A partial last record (the process was killed mid-write) is
    an error naming its offset, unless allow_truncated, which drops it."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such trace (MEDUSA_TRACE names the file to create)")
    raw = path.read_bytes()
    h = _check_header(path, raw)
    body = len(raw) - HEADER_SIZE
    extra = body % RECORD_SIZE
    if extra and not allow_truncated:
        off = len(raw) - extra
        raise TraceError(
            f"{path}: truncated: a partial record at offset {off} "
            f"({extra} of {RECORD_SIZE} bytes); "
            "the recording process was cut off mid-write. Read the complete records with "
            "allow_truncated=True (--allow-truncated)"
        )
    recs = np.frombuffer(raw, RECORD_DTYPE, count=body // RECORD_SIZE, offset=HEADER_SIZE)
    bpath = path.with_name(path.name + ".blobs")
    blobs = bpath.read_bytes() if bpath.exists() else b""
    if recs.size and blobs[:8] != BLOB_MAGIC and int(recs["blob"].max()) > 0:
        raise TraceError(f"{bpath}: missing or not a blob side table (expected {BLOB_MAGIC!r})")
    _check_records(path, recs, len(blobs))
    apis: tuple[str, ...] = ()
    first = recs[recs["type"] == Ev.APIS]
    if first.size:
        row = first[0]
        b = Trace(path, 0, Mode.RECORD, 0, recs[:0], blobs, (), False).blob(int(row["blob"]))
        apis = tuple(s.decode() for s in b.split(b"\0")[: int(row["u"][0])])
    complete = bool(recs.size) and int(recs["type"][-1]) == Ev.END
    return Trace(
        path, int(h["pid"]), Mode(int(h["mode"])), int(h["start_unix_ns"]), recs, blobs, apis,
        complete,
    )  # fmt: skip


def _check_records(path: Path, recs: np.ndarray, blob_size: int) -> None:
    if not recs.size:
        return
    types = recs["type"]
    bad = np.flatnonzero((types < min(Ev)) | (types > max(Ev)))
    if bad.size:
        i = int(bad[0])
        raise TraceError(
            f"{path}: record {i} at offset {HEADER_SIZE + i * RECORD_SIZE} has unknown type "
            f"{int(types[i])}; the file is corrupt or from a newer medusa"
        )
    boffs = recs["blob"]
    bad = np.flatnonzero(boffs + 4 > blob_size)
    bad = bad[boffs[bad] != 0]
    if bad.size:
        i = int(bad[0])
        raise TraceError(
            f"{path}: record {i} at offset {HEADER_SIZE + i * RECORD_SIZE} points past the end "
            f"of {path.name}.blobs ({blob_size} bytes); the side file is truncated or belongs to "
            "another trace"
        )
    seqs = recs["seq"]
    if seqs.size > 1 and not bool(np.all(seqs[1:] > seqs[:-1])):
        i = int(np.flatnonzero(seqs[1:] <= seqs[:-1])[0]) + 1
        raise TraceError(
            f"{path}: record {i} at offset {HEADER_SIZE + i * RECORD_SIZE} is out of sequence; "
            "two processes wrote one file (put %p in MEDUSA_TRACE)"
        )
