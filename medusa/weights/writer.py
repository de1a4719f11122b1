"""Writing a weight store: the tensors in load order at aligned offsets, a checksum per chunk
computed as the bytes are written, the header last, then an atomic rename."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from medusa.weights.format import CHUNK_BYTES, Tensor, encode_header, layout, parse_header


class _ChunkHasher:
    """XXH3-128 of each chunk_size run of the bytes fed to it, in order."""

    def __init__(self, chunk_size: int) -> None:
        self.size, self.left = chunk_size, chunk_size
        self.h = xxhash.xxh3_128()
        self.digests = bytearray()

    def feed(self, data: memoryview) -> None:
        while len(data):
            n = min(self.left, len(data))
            self.h.update(data[:n])
            data, self.left = data[n:], self.left - n
            if not self.left:
                self.digests += self.h.digest()
                self.h.reset()
                self.left = self.size

    def finish(self) -> bytes:
        if self.left != self.size:
            self.digests += self.h.digest()
        return bytes(self.digests)


def write_store(
    out: Path,
    shapes: list[tuple[str, tuple[int, ...]]],
    tensors: Iterable[tuple[str, np.ndarray]],
    model: dict[str, Any],
    *,
    chunk_size: int = CHUNK_BYTES,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Writes `tensors` (float32 arrays in the order and shapes of `shapes`) to the store `out`;
    returns its summary (file size, header digest, counts). `progress(done, total)`: bytes."""
    entries, data_size = layout(shapes)
    num_chunks = -(-data_size // chunk_size)
    placeholder = encode_header(entries, data_size, chunk_size, model, bytes(16 * num_chunks))
    out.parent.mkdir(parents=True, exist_ok=True)
    need = len(placeholder) + data_size
    check_space(out.parent, need, "the weight store")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(placeholder)
            digests = _write_data(f, entries, tensors, chunk_size, data_size, progress)
            head = encode_header(entries, data_size, chunk_size, model, digests)
            if len(head) != len(placeholder):
                raise RuntimeError("the weight store's header changed size while written")
            f.seek(0)
            f.write(head)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except OSError as e:
        os.unlink(tmp)
        if e.errno in NO_SPACE:
            raise no_space(e.errno, out.parent, need, "the weight store") from None
        raise
    except BaseException:
        os.unlink(tmp)
        raise
    return {
        "size": len(head) + data_size,
        "header_sha256": parse_header(head, len(head) + data_size, str(out)).digest,
        "tensors": len(entries),
        "data_bytes": data_size,
        "chunk_size": chunk_size,
        "chunks": num_chunks,
        "hash": "xxh3_128",
    }


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def check_space(directory: Path, need: int, what: str) -> None:
    """OSError(ENOSPC) naming `directory` and the space `what` needs unless it has that free."""
    st = os.statvfs(directory)
    if st.f_bavail * st.f_frsize < need:
        raise no_space(errno.ENOSPC, directory, need, what)


def no_space(code: int, directory: Path, need: int, what: str) -> OSError:
    """The error a full disk (or quota) gives, saying where and how much."""
    try:
        st = os.statvfs(directory)
        free = f"{st.f_bavail * st.f_frsize / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    return OSError(
        code,
        f"{directory}: no space left for {what} ({need / 2**20:.0f} MiB needed, {free}); free "
        "some space there or write elsewhere (--out)",
    )


def _write_data(
    f: Any,
    entries: list[Tensor],
    tensors: Iterable[tuple[str, np.ndarray]],
    chunk_size: int,
    data_size: int,
    progress: Callable[[int, int], None] | None,
) -> bytes:
    hasher = _ChunkHasher(chunk_size)
    pos = 0
    it = iter(tensors)
    for t in entries:
        name, arr = next(it, (None, None))
        if name != t.name or arr is None or tuple(arr.shape) != t.shape:
            got = f"{name} {None if arr is None else arr.shape}"
            raise ValueError(f"the weight store expects {t.name} {t.shape} next, got {got}")
        pad = bytes(t.offset - pos)
        raw = np.ascontiguousarray(arr, np.float32).data.cast("B")
        for part in (memoryview(pad), raw):
            f.write(part)
            hasher.feed(part)
        pos = t.end
        if progress:
            progress(pos, data_size)
    return hasher.finish()
