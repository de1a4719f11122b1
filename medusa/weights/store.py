"""An open weight store: its header checked, and its bytes read from the file (pread), never
mapped: another local user may write or cut short a file while a worker loads it, and a mapping
cut short kills the reader with SIGBUS. What is mapped is a sealed copy (medusa.weights.sealed):
memory nobody can change or shrink, which weights="host" registers for the device to read."""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
import threading
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from medusa.weights.errors import WeightStoreError
from medusa.weights.format import Header, Tensor, header_size, parse_header

# A file changed this close before a check may change again with the same times (they are coarse):
# like git's racy-clean rule, a pooled worker reuses what it read of an artifact at warm-up only
# if no file of it changed for this long before (medusa.serve.prepared). NOTE: file times are
# no proof that bytes are unchanged (a write through a shared mapping changes neither time):
# nothing that is used without being read and checked again may rely on them.
RACY_SECONDS = 2.0

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO never hangs


class WeightStore:
    def __init__(
        self,
        path: Path,
        header: Header,
        fd: int,
        nbytes: int,
        *,
        mapping: mmap.mmap | None = None,
        vouched: bool = False,
    ) -> None:
        """fd: the file (owned: closed with the store), or a sealed copy's memfd, then mapped
        (`mapping`). vouched: every chunk of the sealed copy was checked by whoever sealed it."""
        self.path = path
        self.header = header
        self.fd = fd
        self.nbytes = nbytes
        self.vouched = vouched
        self._mm = mapping
        self._data = np.frombuffer(mapping, np.uint8) if mapping is not None else None
        self.tensors = {t.name: t for t in header.tensors}
        self._tokenizer: dict[str, Any] | None = None
        self._prefault: threading.Thread | None = None

    @property
    def model(self) -> dict[str, Any]:
        return self.header.model

    @property
    def sealed(self) -> bool:
        """A copy in memory nobody can change (mapped), not the file."""
        return self._data is not None

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
    def address(self) -> int:
        """Where a sealed copy's mapping starts in this process."""
        if self._data is None:
            raise RuntimeError(f"{self.path}: read from its file, not mapped (seal it first)")
        return int(self._data.ctypes.data)

    def prefault(self) -> threading.Thread:
        """Maps a sealed copy's pages into this process on a background thread (a read of one
        byte per page; numpy lets go of the GIL), so that the first forward does not fault them
        in one at a time: a fresh worker reading SmolLM2's 514 MiB of host weights spent about
        26 ms in page faults on the 2-core VM. Once per store: later calls return the same
        thread (join it to wait)."""
        data = self._data
        if data is None:
            raise RuntimeError(f"{self.path}: read from its file, not mapped (seal it first)")
        if self._prefault is None:
            self._prefault = threading.Thread(
                target=lambda: int(data[:: mmap.PAGESIZE].sum()), daemon=True,
                name="weights-prefault",
            )  # fmt: skip
            self._prefault.start()
        return self._prefault

    def data(self, start: int, end: int) -> np.ndarray:
        """Bytes [start, end) of a sealed copy's data, a view of its mapping (not checked)."""
        if self._data is None:
            raise RuntimeError(f"{self.path}: read from its file, not mapped (use read())")
        off = self.header.data_offset
        return self._data[off + start : off + end]

    def read(self, start: int, end: int) -> np.ndarray:
        """Bytes [start, end) of the data (not checked): a view of a sealed copy, or read from
        the file; WeightStoreError if the file ends before them (cut short since it was opened)."""
        if self._data is not None:
            return self.data(start, end)
        out = bytearray(end - start)
        view, at = memoryview(out), self.header.data_offset + start
        while len(view):
            try:
                got = os.preadv(self.fd, [view], at)
            except OSError as e:
                raise WeightStoreError(f"{self.path}: cannot be read ({e.strerror})") from None
            if got == 0:
                raise WeightStoreError(
                    f"{self.path}: ends before byte {at} its header promises (cut short or "
                    "rewritten while in use); materialize again"
                )
            view, at = view[got:], at + got
        return np.frombuffer(out, np.uint8)

    def array(self, t: Tensor) -> np.ndarray:
        """Tensor t as a float32 array (not checked)."""
        return self.read(t.offset, t.end).view(np.float32).reshape(t.shape)

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
            self.check_chunk(i, self.read(*self.header.chunk_range(i)))

    def describe_chunk(self, i: int) -> str:
        start, end = self.header.chunk_range(i)
        names = [t.name for t in self.header.tensors if t.offset < end and t.end > start]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f"bytes {start}..{end} of the data: {shown or 'padding'}"

    def close(self) -> None:
        """Closes the file (and unmaps a sealed copy, once no array from it is left: a view
        still held keeps the mapping until it goes)."""
        self._data = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # NOTE: the views hold the mmap object; it unmaps when the last one is freed
            self._mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def file_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when a file is replaced, moved in or written by write(2): device, inode,
    size, times (not a write through a shared mapping: see RACY_SECONDS)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def read_header(fd: int, size: int, where: str) -> Header:
    """The header of the store open as `fd` (`size` bytes), checked (format.parse_header)."""
    head = os.pread(fd, min(size, 1 << 16), 0)
    end = header_size(head, where)
    if end > size:
        raise WeightStoreError(f"{where}: cut short inside its header; materialize again")
    if end > len(head):
        head += os.pread(fd, end - len(head), len(head))
    return parse_header(head, size, where)


def check_digest(header: Header, digest: str | None, where: str) -> None:
    if digest is not None and header.digest != digest:
        raise WeightStoreError(
            f"{where}: its header is not the one the artifact's manifest seals (replaced or "
            "changed after materialize); materialize again"
        )


def open_store(path: str | Path, *, digest: str | None = None) -> WeightStore:
    """Opens a weight store, its header checked (and, given `digest`, that it is the header an
    artifact's manifest sealed). Its bytes are read as needed; chunks are checked as loaded."""
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
        header = read_header(fd, st.st_size, str(path))
        check_digest(header, digest, str(path))
    except OSError as e:
        os.close(fd)
        raise WeightStoreError(f"{path}: cannot be read ({e.strerror})") from None
    except BaseException:
        os.close(fd)
        raise
    return WeightStore(path, header, fd, st.st_size)
