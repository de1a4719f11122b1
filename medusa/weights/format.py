"""The weight store's on-disk layout, and its header parsed with every size and offset checked
before use.

    prefix     magic "MEDUSAWS", format version, hash algorithm, JSON length, number of chunks,
               data offset, data size (little-endian, 48 bytes)
    JSON       chunk size, alignment, the tensors in load order (name, dtype, shape, offset,
               nbytes; offsets relative to the data), the model (identity, name, spec), then a
               newline and the model's tokenizer record as JSON of its own (JSON text never
               holds a raw newline): a start that has its tokenizer already (a pooled worker)
               never parses it, and the rest parses in a millisecond, not 40 ms
    table      one 16-byte XXH3-128 digest per chunk of the data
    digest     sha256 of everything above: what an artifact's manifest seals
    padding    to the data offset (a multiple of ALIGNMENT)
    data       every tensor at an ALIGNMENT-aligned offset, exactly as it lies in device memory

The data is hashed in fixed-size chunks (the last may be shorter), so a loader checks each chunk
as it copies it, with no pass of its own over the file."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from medusa.weights.errors import WeightStoreError

MAGIC = b"MEDUSAWS"
VERSION = 2  # 2: the tokenizer record after the JSON, parsed on demand
HASH_XXH3_128 = 1
HASHES = {HASH_XXH3_128: "xxh3_128"}
DIGEST_BYTES = 16
PREFIX = struct.Struct("<8sIIQQQQ")
ALIGNMENT = 4096  # a tensor can be mapped or registered in place
CHUNK_BYTES = 4 << 20
MIN_CHUNK, MAX_CHUNK = 64 << 10, 4 << 20  # MAX_CHUNK: one staging slot holds a chunk
MAX_JSON = 64 << 20  # a tokenizer of a 256k vocabulary is about 20 MiB of JSON
MAX_TENSORS = 1 << 16
DTYPES = {"float32": 4}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # from the start of the data
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class Header:
    chunk_size: int
    data_offset: int
    data_size: int
    tensors: tuple[Tensor, ...]
    chunk_digests: bytes  # DIGEST_BYTES per chunk
    model: dict[str, Any]  # identity, name, spec, source files
    tokenizer_json: bytes  # the model's tokenizer record (WeightStore.tokenizer_record parses it)
    digest: str  # sha256 of the header: what the manifest seals
    header_bytes: int  # prefix + JSON + table (the digest follows)

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_digests) // DIGEST_BYTES

    def chunk_range(self, i: int) -> tuple[int, int]:
        """[start, end) of chunk i, relative to the data."""
        start = i * self.chunk_size
        return start, min(start + self.chunk_size, self.data_size)

    def chunk_digest(self, i: int) -> bytes:
        return self.chunk_digests[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES]


def align(n: int, to: int = ALIGNMENT) -> int:
    return -(-n // to) * to


def layout(shapes: list[tuple[str, tuple[int, ...]]]) -> tuple[list[Tensor], int]:
    """Each tensor (float32) at the next aligned offset; and the data size."""
    out, pos = [], 0
    for name, shape in shapes:
        nbytes = math.prod(shape) * DTYPES["float32"]
        out.append(Tensor(name, "float32", tuple(shape), pos, nbytes))
        pos = align(pos + nbytes)
    return out, (out[-1].end if out else 0)


def encode_header(
    tensors: list[Tensor], data_size: int, chunk_size: int, model: dict[str, Any], digests: bytes
) -> bytes:
    """Prefix + JSON + table + digest, zero-padded to the data offset. The model's "tokenizer"
    record goes after the JSON, a newline between them."""
    model = dict(model)
    tokenizer = model.pop("tokenizer", None)
    body = json.dumps(
        {
            "chunk_size": chunk_size,
            "alignment": ALIGNMENT,
            "tensors": [[t.name, t.dtype, list(t.shape), t.offset, t.nbytes] for t in tensors],
            "model": model,
        },
        separators=(",", ":"),
    ).encode()
    body += b"\n" + json.dumps(tokenizer, separators=(",", ":")).encode()
    n = len(digests) // DIGEST_BYTES
    data_offset = align(PREFIX.size + len(body) + len(digests) + 32)
    head = PREFIX.pack(MAGIC, VERSION, HASH_XXH3_128, len(body), n, data_offset, data_size)
    head += body + digests
    head += hashlib.sha256(head).digest()
    return head + bytes(data_offset - len(head))


def header_size(prefix: bytes, where: str) -> int:
    """How many bytes of the file the header (with its digest) takes, from the prefix alone."""
    if len(prefix) < PREFIX.size:
        raise _bad(where, f"{len(prefix)} bytes, shorter than a store's header")
    magic, version, algo, json_len, n, data_offset, data_size = PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise _bad(where, "not a medusa weight store (wrong magic)")
    if version != VERSION:
        raise WeightStoreError(
            f"{where}: weight store format {version}, this medusa reads format {VERSION}; "
            "materialize again with this version"
        )
    if algo not in HASHES:
        raise _bad(where, f"unknown chunk hash algorithm {algo}")
    if json_len > MAX_JSON or n > data_size // MIN_CHUNK + 1:
        raise _bad(where, f"a header of {json_len} JSON bytes and {n} chunks is out of bounds")
    end = PREFIX.size + json_len + n * DIGEST_BYTES + 32
    if data_offset < end or data_offset % ALIGNMENT:
        raise _bad(where, f"data offset {data_offset} overlaps the header or is not aligned")
    return end


def parse_header(raw: bytes, file_size: int, where: str) -> Header:
    """The header from the file's first header_size() bytes; WeightStoreError unless every field
    is consistent with the others and with the file's size."""
    end = header_size(raw, where)
    if len(raw) < end:
        raise _bad(where, "cut short inside its header")
    _, _, _, json_len, n, data_offset, data_size = PREFIX.unpack_from(raw)
    body_end = PREFIX.size + json_len
    table_end = body_end + n * DIGEST_BYTES
    digest = hashlib.sha256(raw[:table_end]).digest()
    if digest != raw[table_end:end]:
        raise _bad(where, "its header does not match the header's own checksum (corrupted)")
    if data_offset + data_size != file_size:
        raise _bad(
            where, f"{file_size} bytes, the header says {data_offset + data_size} (truncated?)"
        )
    section = raw[PREFIX.size : body_end]
    cut = section.find(b"\n")
    try:
        if cut < 0:
            raise ValueError("no tokenizer record after the JSON")
        body = json.loads(section[:cut])
        chunk_size = _int(body["chunk_size"], "chunk_size")
        if _int(body["alignment"], "alignment") != ALIGNMENT:
            raise ValueError(f"alignment {body['alignment']}, expected {ALIGNMENT}")
        tensors = _tensors(body["tensors"], data_size)
        model = body["model"]
        if not isinstance(model, dict):
            raise ValueError("model: expected an object")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise _bad(where, f"its header is not what this medusa writes ({e})") from None
    if chunk_size & (chunk_size - 1) or not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        raise _bad(where, f"chunk size {chunk_size} is not a power of two in [64 KiB, 4 MiB]")
    if n != -(-data_size // chunk_size):
        raise _bad(where, f"{n} chunk checksums for {data_size} bytes in chunks of {chunk_size}")
    return Header(chunk_size, data_offset, data_size, tensors, raw[body_end:table_end], model,
                  section[cut + 1 :], digest.hex(), table_end)  # fmt: skip


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62:
        raise ValueError(f"{what}: expected a non-negative integer, got {str(v)[:40]}")
    return v


def _tensors(items: Any, data_size: int) -> tuple[Tensor, ...]:
    if not isinstance(items, list) or len(items) > MAX_TENSORS:
        raise ValueError(f"tensors: expected a list of at most {MAX_TENSORS}")
    out: list[Tensor] = []
    names: set[str] = set()
    pos = 0
    for item in items:
        name, dtype, shape, offset, nbytes = item
        if not isinstance(name, str) or len(name) > 256 or name in names:
            raise ValueError(f"tensor name {str(name)[:60]!r}: not a new name of <= 256 chars")
        if dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {str(dtype)[:20]!r}, expected one of {list(DTYPES)}")
        if not isinstance(shape, list) or not 1 <= len(shape) <= 4:
            raise ValueError(f"{name}: shape {str(shape)[:40]}: expected 1 to 4 dimensions")
        dims = tuple(_int(d, f"{name} shape") for d in shape)
        offset, nbytes = _int(offset, f"{name} offset"), _int(nbytes, f"{name} nbytes")
        if nbytes != math.prod(dims) * DTYPES[dtype]:
            raise ValueError(f"{name}: {nbytes} bytes for shape {list(dims)} of {dtype}")
        if offset % ALIGNMENT or offset < pos or offset + nbytes > data_size:
            raise ValueError(f"{name}: offset {offset} is unaligned, overlaps, or is past the data")
        pos = offset + nbytes
        names.add(name)
        out.append(Tensor(name, dtype, dims, offset, nbytes))
    return tuple(out)


def _bad(where: str, what: str) -> WeightStoreError:
    return WeightStoreError(f"{where}: {what}; materialize again to rewrite the weight store")
