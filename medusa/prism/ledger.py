"""One page budget per device, shared by every worker process on it (Prism's cross-process
accounting; kvcached keeps the same counters in shared memory).

The ledger is a small file (in the gateway's private directory under /dev/shm: mode 0600, this
user's only) mapped by each worker: a header with the capacity in pages, then one row per worker
(pid, name, pages held). Updates take an flock on the file, which the kernel releases when a holder
dies, so a crashed worker never wedges the others. Acquiring is all or nothing: a request for n
pages that cannot be met changes nothing (kvcached lost pages on a failed partial allocation, its
issue #364).

Every row read is checked, and nothing in the file is taken on trust:
- A row is live only while its holder holds an open-file-description lock on the row's bytes
  (F_OFD_SETLK, released by the kernel when the holder exits): a row nobody holds (its worker
  died, its pid was reused, or it was written by hand) is cleared and its pages reclaimed. The
  pid in a row is only a label; no signal is ever sent to it.
- A free row must be all zeroes; a live row's pid must be within 1..pid_max and its pages within
  0..capacity: such a row of a live holder is counted clamped (and logged) until its holder
  rewrites it, which it does at its next change: each holder keeps its own count and writes it,
  never a count read back from the file.
- A header that is not this format, or a file that is not this user's private (0600) regular
  file, is refused with LedgerError naming the file."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import mmap
import os
import stat
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from medusa.errors import RefusedError

MAGIC = b"MDSLEDG1"
HEADER = struct.Struct("<8sqqq")  # magic, capacity pages, page bytes, rows
ROW = struct.Struct("<qq32s")  # pid (0: free row), pages held, worker name
MAX_ROWS = 64
MAX_PAGES = 1 << 40  # a header past this (or a page past 1 TiB) is not one we wrote
SIZE = HEADER.size + MAX_ROWS * ROW.size
FLOCK = struct.Struct("@hh4xqqi4x")  # struct flock: type, whence, start, len, pid

log = logging.getLogger("medusa.prism")


class LedgerError(RefusedError, RuntimeError):
    """The ledger file is missing, not a ledger, not this user's, or full of workers."""


@dataclass(frozen=True)
class Holder:
    pid: int
    name: str
    pages: int


@functools.cache
def pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 1 << 22  # Linux's largest


class PageLedger:
    """A device's page budget, as this process sees it; `join` before acquiring."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise LedgerError(f"{self.path}: no page ledger here; the gateway makes it") from None
        except OSError as e:
            raise LedgerError(f"{self.path}: cannot open the page ledger: {e.strerror}") from None
        try:
            self._check_file()
            self._map = mmap.mmap(self._fd, SIZE)
        except BaseException:
            os.close(self._fd)
            raise
        magic, self.capacity, self.page_bytes, rows = HEADER.unpack_from(self._map, 0)
        if magic != MAGIC or rows != MAX_ROWS:
            self.close()
            raise LedgerError(f"{self.path}: not a page ledger (magic {magic!r}, {rows} rows)")
        if not (0 <= self.capacity <= MAX_PAGES and 0 < self.page_bytes <= MAX_PAGES):
            self.close()
            raise LedgerError(
                f"{self.path}: a corrupt page ledger (capacity {self.capacity} pages of "
                f"{self.page_bytes} bytes); restart the gateway that made it to make it again"
            )
        self._row: int | None = None
        self._pages = 0  # what this process holds: the truth its row is rewritten with
        self._name = ""
        self._warned: set[str] = set()

    def _check_file(self) -> None:
        st = os.fstat(self._fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != SIZE:
            raise LedgerError(f"{self.path}: {st.st_size} bytes is not a page ledger")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise LedgerError(
                f"{self.path}: not a private page ledger of this user (owner uid {st.st_uid}, "
                f"mode {stat.S_IMODE(st.st_mode):o}); only the ledger this user's gateway made "
                "(mode 600) is joined: start the worker from that gateway"
            )

    @classmethod
    def create(cls, path: str | Path, capacity: int, page_bytes: int) -> PageLedger:
        """A new ledger for `capacity` pages of `page_bytes` each (replaces an old file). It is
        written under a fresh name (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) and renamed into
        place: no link planted in the directory is followed."""
        if not (0 <= capacity <= MAX_PAGES and 0 < page_bytes <= MAX_PAGES):
            raise ValueError(f"capacity {capacity} and page_bytes {page_bytes}: need >= 0 and > 0")
        path = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(HEADER.pack(MAGIC, capacity, page_bytes, MAX_ROWS))
                f.write(bytes(MAX_ROWS * ROW.size))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return cls(path)

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)  # NOTE: the row's lock goes with it

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    # ---- rows ----
    def _read(self, i: int) -> tuple[int, int, str]:
        pid, pages, name = ROW.unpack_from(self._map, HEADER.size + i * ROW.size)
        return pid, pages, name.rstrip(b"\0").decode("utf-8", "replace")

    def _write(self, i: int, pid: int, pages: int, name: str) -> None:
        ROW.pack_into(self._map, HEADER.size + i * ROW.size, pid, pages, name.encode()[:32])

    def _row_lock(self, i: int, kind: int, cmd: int) -> bytes:
        arg = FLOCK.pack(kind, os.SEEK_SET, HEADER.size + i * ROW.size, ROW.size, 0)
        return fcntl.fcntl(self._fd, cmd, arg)  # type: ignore[return-value]

    def _held_by_another(self, i: int) -> bool:
        """Some open ledger (another process's, or another of this one's) holds row i."""
        got = self._row_lock(i, fcntl.F_WRLCK, fcntl.F_OFD_GETLK)
        return FLOCK.unpack(got)[0] != fcntl.F_UNLCK

    def _scan(self) -> list[tuple[int, int, str]]:
        """Under the lock: every row checked (see the module's doc); the live rows, counted."""
        live = []
        for i in range(MAX_ROWS):
            if i == self._row:
                self._write(i, os.getpid(), self._pages, self._name)  # ours: our own count
                live.append((os.getpid(), self._pages, self._name))
                continue
            pid, pages, name = self._read(i)
            if (pid, pages, name) == (0, 0, ""):
                continue
            if pid == 0 or not self._held_by_another(i):
                self._write(i, 0, 0, "")  # its holder is gone, or it never had one
                continue
            if not (0 < pid <= pid_max() and 0 <= pages <= self.capacity):
                self._warn(f"row {i} ({name!r}) says pid {pid} holds {pages} pages")
                pid, pages = max(0, min(pid, pid_max())), max(0, min(pages, self.capacity))
            live.append((pid, pages, name))
        used = sum(p for _, p, _ in live)
        if used > self.capacity:
            self._warn(f"its live rows hold {used} pages, more than its {self.capacity}")
        return live

    def _warn(self, what: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("page ledger %s: %s; counted within bounds until its holder rewrites it",
                        self.path, what)  # fmt: skip

    def _used(self) -> int:
        return sum(p for _, p, _ in self._scan())

    # ---- this process's row ----
    def join(self, name: str) -> None:
        """Takes a row for this process (its pages are counted under `name`)."""
        if self._row is not None:
            raise LedgerError(f"{self.path}: this ledger has joined already, as {self._name!r}")
        with self._locked():
            self._scan()
            for i in range(MAX_ROWS):
                if self._read(i)[0] != 0:
                    continue
                try:
                    self._row_lock(i, fcntl.F_WRLCK, fcntl.F_OFD_SETLK)
                except OSError:  # held, though its row reads free: someone writing it
                    continue
                self._row, self._pages, self._name = i, 0, name[:32]
                self._write(i, os.getpid(), 0, self._name)
                return
        raise LedgerError(f"{self.path}: all {MAX_ROWS} worker rows are taken")

    def try_acquire(self, n: int) -> bool:
        """Takes n pages for this worker if the device has them, else changes nothing."""
        row = self._own_row()
        if n < 0:
            raise ValueError(f"cannot take {n} pages")
        with self._locked():
            if self._used() + n > self.capacity:
                return False
            self._pages += n
            self._write(row, os.getpid(), self._pages, self._name)
            return True

    def release(self, n: int) -> None:
        row = self._own_row()
        if not 0 <= n <= self._pages:
            raise LedgerError(f"releasing {n} pages, this worker holds {self._pages}")
        with self._locked():
            self._pages -= n
            self._write(row, os.getpid(), self._pages, self._name)

    def leave(self) -> None:
        """Gives back every page this worker holds and its row."""
        if self._row is None:
            return
        with self._locked():
            self._write(self._row, 0, 0, "")
            self._row_lock(self._row, fcntl.F_UNLCK, fcntl.F_OFD_SETLK)
        self._row, self._pages = None, 0

    def held(self) -> int:
        self._own_row()
        return self._pages

    def free(self) -> int:
        """Pages no live worker holds (rows nobody holds are cleared first: the gateway places
        and evicts by this, and a crashed worker must not keep its pages)."""
        with self._locked():
            return self.capacity - self._used()

    def holders(self) -> list[Holder]:
        with self._locked():
            return [Holder(pid, name, pages) for pid, pages, name in self._scan()]

    def _own_row(self) -> int:
        if self._row is None:
            raise LedgerError("join the ledger before taking or giving back pages")
        return self._row
