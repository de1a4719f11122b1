"""What the reader trusts in a trace, checked before anything is built or allocated from it.

A trace and its side files may come from anywhere: every count, size and offset in them is
checked against the bytes actually there, so that a corrupt or hostile file gets a TraceError
naming the byte offset, never another exception, a read past the data or an allocation it sized.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np

from medusa.errors import RefusedError
from medusa.trace.format import (
    BLOB_MAGIC,
    HEADER_DTYPE,
    HEADER_SIZE,
    MAGIC,
    RECORD_SIZE,
    VERSION,
    Ev,
    Mode,
)


class TraceError(RefusedError, ValueError):
    """A trace that cannot be read as it is; the message names the file, the offset and the fix."""


def read_regular(path: Path, what: str, *, follow: bool = True) -> bytes:
    """The bytes of a regular file, no more than it held when opened. A FIFO or device (which
    could block, or as /dev/zero fill memory) is refused, and so is a link where follow is off."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)
    except OSError as e:
        link = " (a symbolic link: the recorder never writes one)" if not follow else ""
        raise TraceError(f"{path}: cannot open the {what}: {e.strerror}{link}") from None
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TraceError(
                f"{path}: the {what} is not a regular file; pass the files the recorder wrote"
            )
        return f.read(st.st_size)


def _field(name: str) -> int:
    return HEADER_DTYPE.fields[name][1]  # type: ignore[index]


# HEADER_DTYPE's fields (its reserved bytes aside), read without numpy: a restore reads a trace
# in a fresh process, where a numpy call's first time is what it costs.
_HEADER = struct.Struct("<8sIIIIQII24x")
_HEADER_FIELDS = ("magic", "version", "header_size", "record_size", "pid", "start_unix_ns",
                  "mode", "minor")  # fmt: skip
assert _HEADER.size == HEADER_SIZE and HEADER_DTYPE.names[:-1] == _HEADER_FIELDS  # type: ignore[index]


def check_header(path: Path, raw: bytes) -> dict[str, Any]:
    if len(raw) < HEADER_SIZE:
        raise TraceError(
            f"{path}: ends at offset {len(raw)}, inside the {HEADER_SIZE}-byte trace header"
        )
    h = dict(zip(_HEADER_FIELDS, _HEADER.unpack_from(raw), strict=True))
    if bytes(h["magic"]) != MAGIC:
        raise TraceError(
            f"{path}: not a Medusa trace (offset 0 holds {raw[:8]!r}, expected {MAGIC!r}); "
            "pass the file MEDUSA_TRACE named, not its .blobs side file"
        )
    if int(h["version"]) != VERSION:
        raise TraceError(
            f"{path}: trace format version {int(h['version'])} at offset {_field('version')}, "
            f"this medusa reads version {VERSION}; record it again with this build"
        )
    if int(h["record_size"]) != RECORD_SIZE or int(h["header_size"]) != HEADER_SIZE:
        raise TraceError(
            f"{path}: record size {int(h['record_size'])} at offset {_field('record_size')}, "
            f"expected {RECORD_SIZE}; the file is corrupt"
        )
    mode = int(h["mode"])
    if mode not in Mode._value2member_map_:
        raise TraceError(
            f"{path}: mode {mode} at offset {_field('mode')} is neither record (1) nor restore "
            "(2); the file is corrupt"
        )
    return h


def _at(i: int) -> str:
    return f"record {i} at offset {HEADER_SIZE + i * RECORD_SIZE}"


# NOTE: plain ints, not Ev members: an enum member costs a lookup each time it is named, and these
# checks run on every restore.
EV_MIN, EV_MAX = min(map(int, Ev)), max(map(int, Ev))
FUNC, LOAD, APIS, CONTENT, ACCESS = map(int, (Ev.FUNC, Ev.LOAD, Ev.APIS, Ev.CONTENT, Ev.ACCESS))


def check_records(path: Path, recs: np.ndarray, blobs: bytes) -> np.ndarray:
    """Checks every record; returns each one's blob length (blob_lengths)."""
    if not recs.size:
        return np.zeros(0, np.int64)
    types = recs["type"]
    present = np.bincount(types, minlength=EV_MAX + 1)  # how many records of each type
    if len(present) > EV_MAX + 1 or any(present[:EV_MIN].tolist()):
        i = int(np.flatnonzero((types < EV_MIN) | (types > EV_MAX))[0])
        raise TraceError(
            f"{path}: {_at(i)} has unknown type {int(types[i])}; the file is corrupt or from a "
            "newer medusa"
        )
    seqs = recs["seq"]
    if seqs.size > 1 and not (seqs[1:] > seqs[:-1]).all():
        i = int(np.flatnonzero(seqs[1:] <= seqs[:-1])[0]) + 1
        raise TraceError(
            f"{path}: {_at(i)} is out of sequence; two processes wrote one file "
            "(put %p in MEDUSA_TRACE)"
        )
    lens = _check_blob_refs(path, recs, blobs)
    if present[FUNC] or present[CONTENT] or present[ACCESS]:
        _check_counts(path, recs, lens)
    if present[LOAD]:
        _check_load_options(path, recs, blobs, lens)
    return lens


def _check_blob_refs(path: Path, recs: np.ndarray, blobs: bytes) -> np.ndarray:
    """Each record's blob length, once every offset and length is known to lie in the file."""
    boffs = recs["blob"]
    if int(boffs.max()) and blobs[:8] != BLOB_MAGIC:
        raise TraceError(
            f"{path}.blobs: offset 0 holds {blobs[:8]!r}: missing or not a blob side table "
            f"(expected {BLOB_MAGIC!r}); keep the .blobs file beside its trace"
        )
    # NOTE: compared without adding to the offset: a u64 near 2**64 would wrap past any check.
    end = max(len(blobs) - 4, 0)
    bad = np.flatnonzero((boffs != 0) & ((boffs < 8) | (boffs % 8 != 0) | (boffs > end)))
    if bad.size:
        i, o = int(bad[0]), int(boffs[bad[0]])
        where = "past the end of" if o > end else "not at a blob (8-aligned, after the magic) in"
        raise TraceError(
            f"{path}: {_at(i)} points {where} {path.name}.blobs (blob offset {o}, "
            f"{len(blobs)} bytes); the side file is truncated or belongs to another trace"
        )
    lens = blob_lengths(recs, blobs)
    bad = np.flatnonzero(boffs.astype(np.int64) + 4 + lens > len(blobs))
    if bad.size:
        i = int(bad[0])
        raise TraceError(
            f"{path}: {_at(i)} has a blob at offset {int(boffs[i])} of {path.name}.blobs that "
            f"claims {int(lens[i])} bytes, past its end ({len(blobs)} bytes); the side file is "
            "truncated or belongs to another trace"
        )
    return lens


def blob_lengths(recs: np.ndarray, blobs: bytes) -> np.ndarray:
    """Each record's blob length (0 where none), int64; the offsets must be checked already."""
    words = np.frombuffer(blobs, "<u4", count=len(blobs) // 4)
    offs = recs["blob"].astype(np.int64)
    return np.where(offs > 0, words[offs // 4] if words.size else 0, 0).astype(np.int64)


def _check_counts(path: Path, recs: np.ndarray, lens: np.ndarray) -> None:
    """Counts and sizes in the words that say how to cut a blob must fit the blob."""
    types, u = recs["type"], recs["u"]
    # FUNC: u[3] (offset, size) pairs of 8 bytes, then the name.
    bad = (types == FUNC) & (u[:, 3] > (lens // 8).astype(np.uint64))
    # CONTENT: the bytes of an allocation of u[1] bytes, when it was read (result 0).
    ok = recs["result"] == 0
    bad |= (types == CONTENT) & ok & (u[:, 1] != lens.astype(np.uint64))
    # ACCESS: u[2] extents of 24 bytes.
    bad |= (types == ACCESS) & (u[:, 2] * np.uint64(24) != lens.astype(np.uint64))
    i = int(np.argmax(bad)) if bad.any() else -1
    if i >= 0:
        word = {Ev.FUNC: 3, Ev.ACCESS: 2}.get(Ev(int(types[i])), 1)
        raise TraceError(
            f"{path}: {_at(i)} ({Ev(int(types[i])).name}) claims {int(u[i, word])} in u[{word}], "
            f"which its blob of {int(lens[i])} bytes cannot hold; the file is corrupt"
        )


def _check_load_options(path: Path, recs: np.ndarray, blobs: bytes, lens: np.ndarray) -> None:
    """LOAD: u32 jit and library option counts, then 16 bytes per option, then the file name."""
    rows = np.flatnonzero((recs["type"] == LOAD) & (lens >= 8))
    if not rows.size:
        return
    words = np.frombuffer(blobs, "<u4", count=len(blobs) // 4)
    first = (recs["blob"][rows].astype(np.int64) + 4) // 4
    count = words[first].astype(np.int64) + words[first + 1].astype(np.int64)
    bad = np.flatnonzero(8 + 16 * count > lens[rows])
    if bad.size:
        i = int(rows[bad[0]])
        raise TraceError(
            f"{path}: {_at(i)} (LOAD) claims {int(count[bad[0]])} options, which its blob of "
            f"{int(lens[i])} bytes cannot hold; the file is corrupt"
        )


def decode_apis(path: Path, recs: np.ndarray, blobs: bytes, lens: np.ndarray) -> tuple[str, ...]:
    at = np.flatnonzero(recs["type"] == APIS)
    if not at.size:
        return ()
    i = int(at[0])
    o, n = int(recs["blob"][i]), int(lens[i])
    names = blobs[o + 4 : o + 4 + n].split(b"\0")[: int(recs["u"][i, 0])]
    try:
        return tuple(s.decode() for s in names)
    except UnicodeDecodeError:
        raise TraceError(
            f"{path}: {_at(i)} (APIS) holds an api name that is not UTF-8; the file is corrupt"
        ) from None
