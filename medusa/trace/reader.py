"""Reads a trace written by libmedusa_interpose.so: validated numpy views, typed records."""

from __future__ import annotations

import gc
import hashlib
import operator
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from medusa.trace import decode
from medusa.trace import records as R
from medusa.trace.format import HEADER_SIZE, RECORD_DTYPE, RECORD_SIZE, Ev, Mode
from medusa.trace.validate import (
    EV_MAX,
    TraceError,
    blob_lengths,
    check_header,
    check_records,
    decode_apis,
    read_regular,
)

E = TypeVar("E", bound=R.Event)
_SHA256 = re.compile("[0-9a-f]{64}")
STOPPED, LOAD = int(Ev.STOPPED), int(Ev.LOAD)


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
        """A module image the recorder saved, None if it saved none; one whose bytes do not hash
        to its name (altered, or planted to be loaded in its place) is refused."""
        if not _SHA256.fullmatch(sha256):
            raise ValueError(f"image name {sha256!r} is not a sha256 in hex")
        p = self.images_dir / f"{sha256}.img"
        if not os.path.lexists(p):
            return None
        data = read_regular(p, "module image", follow=False)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise TraceError(
                f"{p}: its bytes (from offset 0) do not hash to its name: altered or replaced "
                "since recording; delete it (its kernels are then found by triggering)"
            )
        return data

    def loaded_images(self) -> dict[int, str]:
        """The image sha256 behind each library or module handle a successful load gave, a
        library's module (cuLibraryGetModule: a handle of its own) included."""
        out: dict[int, str] = {}
        for x in self.of(R.Load, Ev.LOAD):
            if x.result == 0:
                out[x.handle] = x.sha256
                if x.module:
                    out[x.module] = x.sha256
        return out

    def loads(self) -> list[tuple[int, bool, str]]:
        """(handle, is_library, image sha256) of each successful load, in order; without building
        the records (a restore reads them on every cold start)."""
        rows = self.records[self.records["type"] == LOAD]
        results, words = rows["result"].tolist(), rows["u"].tolist()
        return [
            (w[0], bool(w[2]), decode.image_digest(w[3:7]))
            for r, w in zip(results, words, strict=True)
            if r == 0
        ]

    @property
    def stopped(self) -> str:
        """Why the recorder stopped before the program ended ("" if it did not): such a trace
        cannot make an artifact."""
        if not (self.records["type"] == STOPPED).any():
            return ""
        return "; ".join(x.reason for x in self.of(R.Stopped, Ev.STOPPED))

    def __len__(self) -> int:
        return len(self.records)

    def api_name(self, api: int) -> str:
        return self.apis[api] if api < len(self.apis) else f"api#{api}"

    def blob(self, offset: int) -> bytes:
        if not offset:
            return b""
        if not 8 <= offset <= len(self.blobs) - 4:
            raise TraceError(f"{self.path}.blobs: no blob at offset {offset}")
        (n,) = struct.unpack_from("<I", self.blobs, offset)
        return self.blobs[offset + 4 : offset + 4 + n]

    def select(self, *types: Ev) -> np.ndarray:
        """The raw records of the given types (all of them when none are given)."""
        if not types:
            return self.records
        # NOTE: a table lookup, not np.isin (which sorts): this runs on every restore.
        wanted = np.zeros(EV_MAX + 1, bool)
        wanted[[int(t) for t in types]] = True
        return self.records[wanted[self.records["type"]]]

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
        lens = blob_lengths(rows, self.blobs)
        b = self.blobs
        return [
            b[o + 4 : o + 4 + n] if n else b""
            for o, n in zip(offs.tolist(), lens.tolist(), strict=True)
        ]

    def _heads(self, rows: np.ndarray) -> list[list]:
        """The common fields as columns: seq, api name, result, t_ns."""
        # Only the api numbers present: a corrupt one (up to 65535) costs one name, not 65536.
        names = {a: self.api_name(a) for a in np.flatnonzero(np.bincount(rows["api"])).tolist()}
        return [
            rows["seq"].tolist(),
            list(map(names.__getitem__, rows["api"].tolist())),
            rows["result"].tolist(),
            rows["t_ns"].tolist(),
        ]

    def _build(self, t: int, rows: np.ndarray) -> list[R.Event]:
        heads = self._heads(rows)
        u = rows["u"]
        simple = decode.SIMPLE.get(t)
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
        build = decode.BUILDERS[t]
        rows_of_heads = zip(*heads, strict=True)
        return [
            build(h, w, blob)
            for h, w, blob in zip(rows_of_heads, u.tolist(), self._blobs_of(rows), strict=True)
        ]

    def of(self, cls: type[E], *types: Ev) -> list[E]:
        """Typed records of one class, e.g. trace.of(Alloc, Ev.ALLOC)."""
        return [e for e in self.events(*types) if isinstance(e, cls)]


def read_trace(path: str | Path, *, allow_truncated: bool = False) -> Trace:
    """Reads and validates a trace. A partial last record (the process was killed mid-write) is
    an error naming its offset, unless allow_truncated, which drops it."""
    path = Path(path)
    try:
        raw = read_regular(path, "trace")
    except TraceError:  # NOTE: looked into only then: a restore reads its trace on every start
        if not path.exists():
            raise TraceError(
                f"{path}: no such trace (MEDUSA_TRACE names the file to create)"
            ) from None
        raise
    h = check_header(path, raw)
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
    blobs = read_regular(bpath, "blob side table") if os.path.lexists(bpath) else b""
    apis = decode_apis(path, recs, blobs, check_records(path, recs, blobs))
    complete = bool(recs.size) and int(recs["type"][-1]) == Ev.END
    return Trace(
        path, int(h["pid"]), Mode(int(h["mode"])), int(h["start_unix_ns"]), recs, blobs, apis,
        complete,
    )  # fmt: skip
