"""Encoding and decoding the plan (msgpack in a zstd frame) within bounds the manifest sets.

The manifest records the plan's uncompressed size. Decoding refuses a frame that declares or
yields any other size, and, before msgpack builds anything, walks the msgpack headers: a container
is refused when it claims more items than bytes remain to hold them (msgpack preallocates what a
header claims, so nested headers would otherwise turn kilobytes into gigabytes), and when the
Python objects it would make cost more than a few times its size (a byte of msgpack can be an empty
list: 56 bytes of Python). The uncompressed size itself is bounded by the compressed file's size,
so memory is bounded by what the artifact actually holds."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import zstandard

from medusa.artifact.errors import ArtifactError

# NOTE: the largest plan this medusa decodes; a plan is tens of KiB to tens of MiB.
MAX_RAW_SIZE = 256 << 20
# A real plan compresses about 30x (saved contents that are all zeros, far more); beyond this ratio
# the manifest's uncompressed size is a claim the file cannot back.
MAX_RATIO = 4096
# Decoded Python objects may cost this many times the plan's bytes (plus a floor): a real plan
# costs about 1.2x (its arrays are bin blobs); a stream of empty containers costs 72x.
MAX_COST_RATIO, COST_FLOOR = 16, 1 << 20
_CONTAINER_COST, _ITEM_COST, _INT_COST = 64, 8, 32
_LEN = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin / str: bytes of length
_FIXED = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xCA: 4, 0xCB: 8}
_COUNT = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # array / map: bytes, per item
_UINT = {1: struct.Struct(">B"), 2: struct.Struct(">H"), 4: struct.Struct(">I")}


def encode_plan(plan: dict[str, Any]) -> tuple[bytes, int]:
    """The compressed payload and its uncompressed size (which the manifest records)."""
    raw = msgpack.packb(plan, use_bin_type=True)
    return zstandard.ZstdCompressor(level=6, write_content_size=True).compress(raw), len(raw)


def decode_plan(data: bytes, raw_size: int, where: str) -> Any:
    if raw_size > MAX_RAW_SIZE:
        raise ArtifactError(
            f"{where}: the manifest says it holds {raw_size} bytes uncompressed, more than the "
            f"{MAX_RAW_SIZE} this medusa decodes; materialize again"
        )
    if raw_size > MAX_RATIO * len(data) + (1 << 20):
        raise ArtifactError(
            f"{where}: the manifest says {len(data)} compressed bytes hold {raw_size} bytes, "
            f"more than {MAX_RATIO} times as many as any plan; refusing to decompress it "
            "(materialize again)"
        )
    raw = _decompress(data, raw_size, where)
    check_headers(raw, where)
    n = len(raw)
    try:
        return msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=False,
            max_str_len=n,
            max_bin_len=n,
            max_array_len=n,
            max_map_len=n,
            max_ext_len=0,
        )
    except (ValueError, msgpack.UnpackException) as e:
        raise ArtifactError(f"{where}: cannot be decoded ({e}); materialize again") from None


def _decompress(data: bytes, raw_size: int, where: str) -> bytes:
    try:
        frame = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError as e:
        raise ArtifactError(f"{where}: not a zstd frame ({e}); materialize again") from None
    if frame.content_size != raw_size:
        unknown = frame.content_size == zstandard.CONTENTSIZE_UNKNOWN
        declared = "no size" if unknown else f"{frame.content_size} bytes"
        raise ArtifactError(
            f"{where}: the frame declares {declared} uncompressed, the manifest {raw_size}; "
            "refusing to decompress it (materialize again)"
        )
    try:
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_size)
    except zstandard.ZstdError as e:
        raise ArtifactError(f"{where}: cannot be decompressed ({e}); materialize again") from None
    if len(raw) != raw_size:
        raise ArtifactError(
            f"{where}: decompressed to {len(raw)} bytes, the manifest says {raw_size}; "
            "materialize again"
        )
    return raw


def check_headers(raw: bytes, where: str) -> None:
    """Walks the msgpack stream's headers: one object, no extension types, and at every point the
    items still owed by open containers (each at least a byte) fit in the bytes left."""
    n, pos, owed = len(raw), 0, 1
    cost, budget = n, MAX_COST_RATIO * n + COST_FLOOR
    while pos < n and owed:
        b = raw[pos]
        pos += 1
        owed -= 1
        cost += _ITEM_COST
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
            continue
        if b <= 0x8F:
            owed += 2 * (b & 0x0F)
            cost += _CONTAINER_COST
        elif b <= 0x9F:
            owed += b & 0x0F
            cost += _CONTAINER_COST
        elif b <= 0xBF:
            pos += b & 0x1F
        elif b in _FIXED:
            pos += _FIXED[b]
            cost += _INT_COST
        elif b in _LEN or b in _COUNT:
            width, per = (_LEN[b], 0) if b in _LEN else _COUNT[b]
            if pos + width > n:
                raise _overclaims(where)
            count = _UINT[width].unpack_from(raw, pos)[0]
            pos += width
            if per:
                owed += per * count
                cost += _CONTAINER_COST
            else:
                pos += count
        else:
            raise ArtifactError(f"{where}: holds a msgpack type a plan never has (0x{b:02x})")
        if pos + owed > n:
            raise _overclaims(where)
        if cost > budget:
            raise ArtifactError(
                f"{where}: decoding it would build Python objects of more than {budget} bytes, "
                f"{MAX_COST_RATIO} times its size (a stream of tiny containers); refusing it "
                "(materialize again)"
            )
    if owed or pos != n:
        raise _overclaims(where)


def _overclaims(where: str) -> ArtifactError:
    return ArtifactError(
        f"{where}: its msgpack headers claim more (or other) data than it holds; refusing to "
        "decode it (materialize again)"
    )
