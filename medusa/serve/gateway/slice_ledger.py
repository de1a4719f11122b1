"""The page ledger of one elastic slice, as the gateway uses it: it reads the free pages and who
holds them, and holds a row per model for its weights. The ledger is a file on the machine whose
workers share the slice (`medusa.prism.ledger`), in the private directory of the process that
starts them (`private_dir`): `FileLedger` there; the ray back-end reaches a node's through its
slice actor, with the same methods (`SliceLedger`)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from medusa import env
from medusa.prism.ledger import Holder, PageLedger
from medusa.serve.gateway.slices import Slice

PREFIX = "ledger-"


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


class FileLedger:
    """A new ledger file for one slice, made (and owned) by this process in `where`, a
    directory of its own (private_dir.PrivateDir: no other user can reach it)."""

    def __init__(self, slice_id: str, pages: int, page_bytes: int, where: Path):
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", slice_id)[:64]
        tag = hashlib.sha256(slice_id.encode()).hexdigest()[:8]  # "a/b" and "a_b" differ
        self.path = where / f"{PREFIX}{name}-{tag}"
        self._ledger = PageLedger.create(self.path, pages, page_bytes)
        self.capacity = self._ledger.capacity
        self._rows: dict[str, PageLedger] = {}

    def free(self) -> int:
        self._rewrite()
        return self._ledger.free()

    def holders(self) -> list[Holder]:
        self._rewrite()
        return self._ledger.holders()

    def _rewrite(self) -> None:
        """Each of the gateway's rows written again from its own count (a row changed in the
        file is put right the next time the gateway reads the ledger)."""
        for row in self._rows.values():
            row.free()  # NOTE: a holder's scan writes its own row

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


def file_ledgers(where: Path) -> OpenLedger:
    """Ledger files on this machine, in `where` (a PrivateDir's path); a slice's workers find its
    ledger by MEDUSA_KV_LEDGER in the slice's env (pooled workers too)."""

    def open_ledger(s: Slice, pages: int, page_bytes: int) -> SliceLedger:
        ledger = FileLedger(s.id, pages, page_bytes, where)
        s.env = {**s.env, env.KV_LEDGER.name: str(ledger.path)}
        return ledger

    return open_ledger
