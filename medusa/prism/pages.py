"""The physical pages behind one reserved KV range: mapped when blocks need them, unmapped when
their last block goes, each one counted in the device's ledger while this worker holds it.

A few pages stay created but unmapped ("spare") so that the next map costs a cuMemMap, not a
cuMemCreate (kvcached's pre-mapped buffer, its MIN/MAX_RESERVED_PAGES); `refill` tops them up off
the critical path and `drain` gives them all back when the model goes idle."""

from __future__ import annotations

from medusa.errors import BusyError
from medusa.prism.ledger import PageLedger
from medusa.prism.vmm import Vmm


class OutOfPages(BusyError, RuntimeError):
    """The device's budget (the ledger) or its memory has no page left for this worker."""


class PagePool:
    def __init__(
        self,
        vmm: Vmm,
        num_pages: int,
        *,
        ledger: PageLedger | None = None,
        spare: int = 2,
    ) -> None:
        self.vmm, self.ledger, self.spare_target = vmm, ledger, spare
        self.page_bytes = vmm.granularity
        self.num_pages = num_pages
        self.base = vmm.reserve(num_pages * self.page_bytes)
        self._handles: dict[int, int] = {}  # page index -> physical handle, while mapped
        self._spare: list[int] = []  # created, unmapped, counted in the ledger

    @property
    def num_mapped(self) -> int:
        return len(self._handles)

    @property
    def num_spare(self) -> int:
        return len(self._spare)

    @property
    def num_held(self) -> int:
        """Pages this worker holds: mapped and spare (what its ledger row says)."""
        return len(self._handles) + len(self._spare)

    def is_mapped(self, page: int) -> bool:
        return page in self._handles

    def map(self, page: int) -> None:
        if page in self._handles:
            return
        h = self._spare.pop() if self._spare else self._create()
        va = self.base + page * self.page_bytes
        try:
            self.vmm.map(va, self.page_bytes, h)
            self.vmm.set_access(va, self.page_bytes)
        except Exception:
            self._spare.append(h)  # NOTE: never lose a page a failed map took (kvcached #364)
            raise
        self._handles[page] = h

    def unmap(self, page: int) -> None:
        h = self._handles.pop(page)
        self.vmm.unmap(self.base + page * self.page_bytes, self.page_bytes)
        if len(self._spare) < self.spare_target:
            self._spare.append(h)
        else:
            self._give_back(h)

    def refill(self) -> None:
        """Creates spare pages up to the target, as far as the budget allows."""
        while len(self._spare) < self.spare_target:
            try:
                self._spare.append(self._create())
            except OutOfPages:
                return

    def drain(self) -> None:
        """Gives every spare page back (the model went idle)."""
        while self._spare:
            self._give_back(self._spare.pop())

    def close(self) -> None:
        for page in list(self._handles):
            self.unmap(page)
        self.drain()
        self.vmm.free_range(self.base, self.num_pages * self.page_bytes)

    def _create(self) -> int:
        if self.ledger is not None and not self.ledger.try_acquire(1):
            raise OutOfPages(f"the device's page budget ({self.ledger.capacity} pages) is used up")
        try:
            return self.vmm.create(self.page_bytes)
        except Exception as e:
            if self.ledger is not None:
                self.ledger.release(1)
            raise OutOfPages(f"no device memory for another page: {e}") from e

    def _give_back(self, handle: int) -> None:
        self.vmm.release(handle)
        if self.ledger is not None:
            self.ledger.release(1)
