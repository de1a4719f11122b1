"""The page ledger of one elastic slice, as the gateway uses it: it reads the free pages and who
holds them, and holds a row per model for its weights. The ledger is a file on the machine whose
workers share the slice (`medusa.prism.ledger`): `FileLedger` there; the ray back-end reaches a
node's through its slice actor, with the same methods (`SliceLedger`)."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from medusa import env
from medusa.prism.ledger import Holder, PageLedger
from medusa.serve.gateway.slices import Slice

PREFIX = "medusa-ledger-"


class SliceLedger(Protocol):
    capacity: int  # pages
    path: Path  # on the machine whose workers share the slice

    def free(self) -> int:
        """Pages no live process holds."""

    def holders(self) -> list[Holder]: ...

    def hold(self, name: str, pages: int) -> bool:
        """Takes `pages` pages in a row of the gateway's own, named `name`; False (and nothing
        taken) if they are not free."""

    def drop(self, name: str) -> None:
        """Gives back the row `hold` took (nothing if there is none)."""

    def remove(self) -> None:
        """Gives back every row and deletes the ledger (at shutdown, once its workers are gone)."""


def ledger_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def sweep(where: Path) -> None:
    """Deletes the ledgers that processes now gone left behind (one killed with SIGKILL, a lost
    Ray node's slice actor): a ledger's name carries the pid of the process that made it."""
    for path in where.glob(f"{PREFIX}*"):
        pid = path.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: not ours to sweep
        return True
    return True


class FileLedger:
    """A new ledger file for one slice, made (and owned) by this process."""

    def __init__(self, slice_id: str, pages: int, page_bytes: int, where: Path | None = None):
        where = where or ledger_dir()
        sweep(where)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", slice_id)
        self.path = where / f"{PREFIX}{os.getpid()}-{name}"
        self._ledger = PageLedger.create(self.path, pages, page_bytes)
        self.capacity = self._ledger.capacity
        self._rows: dict[str, PageLedger] = {}

    def free(self) -> int:
        return self._ledger.free()

    def holders(self) -> list[Holder]:
        return self._ledger.holders()

    def hold(self, name: str, pages: int) -> bool:
        self.drop(name)
        row = PageLedger(self.path)
        row.join(name)
        if not row.try_acquire(pages):
            row.leave()
            row.close()
            return False
        self._rows[name] = row
        return True

    def drop(self, name: str) -> None:
        row = self._rows.pop(name, None)
        if row is not None:
            row.leave()
            row.close()

    def remove(self) -> None:
        for name in list(self._rows):
            self.drop(name)
        self._ledger.close()
        self.path.unlink(missing_ok=True)


OpenLedger = Callable[[Slice, int, int], SliceLedger]  # (slice, pages, page bytes)


def file_ledgers(where: Path | None = None) -> OpenLedger:
    """Ledger files on this machine (in `where`, default /dev/shm); a slice's workers find its
    ledger by MEDUSA_KV_LEDGER in the slice's env (pooled workers too)."""

    def open_ledger(s: Slice, pages: int, page_bytes: int) -> SliceLedger:
        ledger = FileLedger(s.id, pages, page_bytes, where)
        s.env = {**s.env, env.KV_LEDGER.name: str(ledger.path)}
        return ledger

    return open_ledger
