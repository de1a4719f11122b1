"""An open weight store: its header checked, its file mapped read-only and shared (MAP_SHARED),
so every process that maps one store shares its page-cache pages."""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from medusa.weights.errors import WeightStoreError
from medusa.weights.format import Header, Tensor, header_size, parse_header

# A file changed this close before a check may change again with the same times (they are coarse):
# like git's racy-clean rule, only files unchanged for this long before a check are vouched for.
RACY_SECONDS = 2.0

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO never hangs


class WeightStore:
    def __init__(
        self, path: Path, header: Header, mm: mmap.mmap, identity: str = "", mtime_ns: int = 0
    ) -> None:
        self.path = path
        self.header = header
        # The file this mapping shows (device, inode, size, times) and its header: equal in two
        # processes only while they map the same, unchanged file (see HostWeights for the limit
        # of file times).
        self.identity = identity
        self.mtime_ns = mtime_ns
        self.nbytes = len(mm)
        self._mm = mm
        self._data = np.frombuffer(mm, np.uint8)
        self.address = int(self._data.ctypes.data)  # where the mapping starts in this process
        self.tensors = {t.name: t for t in header.tensors}
        self._tokenizer: dict[str, Any] | None = None

    @property
    def model(self) -> dict[str, Any]:
        return self.header.model

    def tokenizer_record(self) -> dict[str, Any]:
        """The model's tokenizer record, parsed on first use (its JSON is most of the header:
        49k tokens and merges for SmolLM2). WeightStoreError if unusable."""
        if self._tokenizer is None:
            try:
                rec = json.loads(self.header.tokenizer_json)
                if not isinstance(rec, dict) or rec.get("kind") not in ("gguf", "json", "bpe"):
                    raise ValueError("not a tokenizer record")
            except (ValueError, RecursionError) as e:
                raise WeightStoreError(
                    f"{self.path}: its tokenizer record is not usable ({e}); materialize again"
                ) from None
            self._tokenizer = rec
        return self._tokenizer

    @property
    def data_address(self) -> int:
        return self.address + self.header.data_offset

    def data(self, start: int, end: int) -> np.ndarray:
        """Bytes [start, end) of the data, a view of the mapping (not checked)."""
        off = self.header.data_offset
        return self._data[off + start : off + end]

    def array(self, t: Tensor) -> np.ndarray:
        """Tensor t as a read-only float32 view of the mapping (not checked)."""
        return self.data(t.offset, t.end).view(np.float32).reshape(t.shape)

    def check_chunk(self, i: int, data: np.ndarray) -> None:
        """Raises WeightStoreError naming chunk i (and its tensors) unless `data` is its bytes."""
        if xxhash.xxh3_128_digest(data.data) != self.header.chunk_digest(i):
            raise WeightStoreError(
                f"{self.path}: chunk {i} of {self.header.num_chunks} ({self.describe_chunk(i)}) "
                "does not match its checksum (corrupted); materialize again to rewrite the store"
            )

    def verify(self) -> None:
        """Checks every chunk (medusa verify); loading checks them as it copies instead."""
        for i in range(self.header.num_chunks):
            self.check_chunk(i, self.data(*self.header.chunk_range(i)))

    def describe_chunk(self, i: int) -> str:
        start, end = self.header.chunk_range(i)
        names = [t.name for t in self.header.tensors if t.offset < end and t.end > start]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f"bytes {start}..{end} of the data: {shown or 'padding'}"

    def close(self) -> None:
        """Unmaps the store (once no array from it is left: a view still held keeps the mapping
        until it goes)."""
        self._data = np.empty(0, np.uint8)
        try:
            self._mm.close()
        except BufferError:
            pass  # NOTE: the views hold the mmap object; it unmaps when the last one is freed

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when a file is written, replaced or moved in: device, inode, size, times."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def open_store(path: str | Path, *, digest: str | None = None) -> WeightStore:
    """Opens and maps a weight store, its header checked (and, given `digest`, that it is the
    header an artifact's manifest sealed). Chunks are checked as they are loaded."""
    path = Path(path)
    try:
        fd = os.open(path, _FLAGS)
    except OSError as e:
        what = "missing" if e.errno == errno.ENOENT else f"cannot be opened ({e.strerror})"
        if e.errno == errno.ELOOP:
            what = "a symbolic link (a store is a regular file)"
        raise WeightStoreError(f"{path}: {what}; materialize again to write the store") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise WeightStoreError(f"{path}: not a regular file; materialize again")
        head = os.pread(fd, min(st.st_size, 1 << 16), 0)
        end = header_size(head, str(path))
        if end > st.st_size:
            raise WeightStoreError(f"{path}: cut short inside its header; materialize again")
        if end > len(head):
            head += os.pread(fd, end - len(head), len(head))
        header = parse_header(head, st.st_size, str(path))
        if digest is not None and header.digest != digest:
            raise WeightStoreError(
                f"{path}: its header is not the one the artifact's manifest seals (replaced or "
                "changed after materialize); materialize again"
            )
        mm = mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    identity = ":".join(map(str, [*file_identity(st), header.digest]))
    return WeightStore(path, header, mm, identity, st.st_mtime_ns)
