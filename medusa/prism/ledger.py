"""One page budget per device, shared by every worker process on it (Prism's cross-process
accounting; kvcached keeps the same counters in shared memory).

The ledger is a small file (normally under /dev/shm) mapped by each worker: a header with the
capacity in pages, then one row per worker (pid, name, pages held). Updates take an flock on the
file, which the kernel releases when a holder dies, so a crashed worker never wedges the others;
its pages are taken back the next time someone is short. Acquiring is all or nothing: a request
for n pages that cannot be met changes nothing (kvcached lost pages on a failed partial
allocation, its issue #364)."""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"MDSLEDG1"
HEADER = struct.Struct("<8sqqq")  # magic, capacity pages, page bytes, rows
ROW = struct.Struct("<qq32s")  # pid (0: free row), pages held, worker name
MAX_ROWS = 64


class LedgerError(RuntimeError):
    """The ledger file is missing, not a ledger, or full of workers."""


@dataclass(frozen=True)
class Holder:
    pid: int
    name: str
    pages: int


class PageLedger:
    """A device's page budget, as this process sees it; `join` before acquiring."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise LedgerError(f"{self.path}: no page ledger here; the gateway makes it") from None
        size = os.fstat(self._fd).st_size
        if size != HEADER.size + MAX_ROWS * ROW.size:
            os.close(self._fd)
            raise LedgerError(f"{self.path}: {size} bytes is not a page ledger")
        self._map = mmap.mmap(self._fd, size)
        magic, self.capacity, self.page_bytes, _ = HEADER.unpack_from(self._map, 0)
        if magic != MAGIC:
            self.close()
            raise LedgerError(f"{self.path}: not a page ledger (magic {magic!r})")
        self._row: int | None = None

    @classmethod
    def create(cls, path: str | Path, capacity: int, page_bytes: int) -> PageLedger:
        """A new ledger for `capacity` pages of `page_bytes` each (replaces an old file)."""
        if capacity < 0 or page_bytes <= 0:
            raise ValueError(f"capacity {capacity} and page_bytes {page_bytes}: need >= 0 and > 0")
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(HEADER.pack(MAGIC, capacity, page_bytes, MAX_ROWS))
            f.write(bytes(MAX_ROWS * ROW.size))
        os.replace(tmp, path)
        return cls(path)

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read(self, i: int) -> tuple[int, int, str]:
        pid, pages, name = ROW.unpack_from(self._map, HEADER.size + i * ROW.size)
        return pid, pages, name.rstrip(b"\0").decode("utf-8", "replace")

    def _write(self, i: int, pid: int, pages: int, name: str) -> None:
        ROW.pack_into(self._map, HEADER.size + i * ROW.size, pid, pages, name.encode()[:32])

    def _used(self) -> int:
        return sum(self._read(i)[1] for i in range(MAX_ROWS))

    def _reclaim_dead(self) -> int:
        """Frees the rows of workers that are gone; the pages they held."""
        freed = 0
        for i in range(MAX_ROWS):
            pid, pages, _ = self._read(i)
            if pid and not _alive(pid):
                self._write(i, 0, 0, "")
                freed += pages
        return freed

    def join(self, name: str) -> None:
        """Takes a row for this process (its pages are counted under `name`)."""
        with self._locked():
            self._reclaim_dead()
            for i in range(MAX_ROWS):
                if self._read(i)[0] == 0:
                    self._write(i, os.getpid(), 0, name)
                    self._row = i
                    return
        raise LedgerError(f"{self.path}: all {MAX_ROWS} worker rows are taken")

    def try_acquire(self, n: int) -> bool:
        """Takes n pages for this worker if the device has them, else changes nothing."""
        row = self._own_row()
        if n < 0:
            raise ValueError(f"cannot take {n} pages")
        with self._locked():
            used = self._used()
            if used + n > self.capacity:
                used -= self._reclaim_dead()
            if used + n > self.capacity:
                return False
            pid, pages, name = self._read(row)
            self._write(row, pid, pages + n, name)
            return True

    def release(self, n: int) -> None:
        row = self._own_row()
        with self._locked():
            pid, pages, name = self._read(row)
            if n > pages:
                raise LedgerError(f"releasing {n} pages, this worker holds {pages}")
            self._write(row, pid, pages - n, name)

    def leave(self) -> None:
        """Gives back every page this worker holds and its row."""
        if self._row is None:
            return
        with self._locked():
            self._write(self._row, 0, 0, "")
        self._row = None

    def held(self) -> int:
        return self._read(self._own_row())[1]

    def free(self) -> int:
        """Pages no live worker holds (a dead worker's rows are freed first: the gateway places
        and evicts by this, and a crashed worker must not keep its pages)."""
        with self._locked():
            self._reclaim_dead()
            return self.capacity - self._used()

    def holders(self) -> list[Holder]:
        with self._locked():
            self._reclaim_dead()
            rows = [self._read(i) for i in range(MAX_ROWS)]
        return [Holder(pid, name, pages) for pid, pages, name in rows if pid]

    def _own_row(self) -> int:
        if self._row is None:
            raise LedgerError("join the ledger before taking or giving back pages")
        return self._row


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
