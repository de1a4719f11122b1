"""KV blocks in an elastic range: the BlockManager interface (the scheduler cannot tell them
apart), with pages mapped under the blocks as they are needed and unmapped when they empty.

Blocks are laid out block-major (one block holds its tokens' K and V for every layer), so one page
serves whole blocks of all layers and an idle model holds only the pages its live blocks touch:
kvcached maps one page id in every layer and in K and V, so a 2 MiB page costs 2 x layers pages.
A block may straddle two pages (or span several, if it is larger than a page). New blocks go to
the fullest partly-used page, so pages empty out and can be unmapped."""

from __future__ import annotations

import heapq

from medusa.engine.sequence import Sequence
from medusa.prism.pages import OutOfPages, PagePool


class ElasticBlockManager:
    def __init__(
        self, pool: PagePool, block_size: int, block_bytes: int, num_blocks: int | None = None
    ) -> None:
        """num_blocks: the blocks the range holds (default: as many as its pages hold)."""
        if block_bytes <= 0:
            raise ValueError(f"block_bytes={block_bytes}: must be positive")
        fit = pool.num_pages * pool.page_bytes // block_bytes
        if num_blocks is not None and not 0 < num_blocks <= fit:
            raise ValueError(f"num_blocks={num_blocks}: the range holds 1..{fit} blocks")
        self.pool, self.block_size, self.block_bytes = pool, block_size, block_bytes
        self.num_blocks = fit if num_blocks is None else num_blocks
        self._free = set(range(self.num_blocks))
        self._ready: set[int] = set()  # free blocks whose pages are all mapped
        self._use = [0] * pool.num_pages  # allocated blocks touching each page
        self._unmapped = [p for p in range(pool.num_pages) if not pool.is_mapped(p)]
        heapq.heapify(self._unmapped)

    # ---- the BlockManager interface ----
    @property
    def num_free_blocks(self) -> int:
        """Free blocks on mapped pages (more come with pages the budget may still give)."""
        return len(self._ready)

    def can_allocate(self, seq: Sequence) -> bool:
        return self._ensure(seq.num_blocks(self.block_size) - len(seq.block_table))

    def allocate(self, seq: Sequence) -> None:
        for _ in range(seq.num_blocks(self.block_size) - len(seq.block_table)):
            seq.block_table.append(self._take())

    def deallocate(self, seq: Sequence) -> None:
        self.give(seq.block_table)
        seq.block_table.clear()

    def can_append(self, seq: Sequence) -> bool:
        return not self._needs_block(seq) or self._ensure(1)

    def may_append(self, seq: Sequence) -> None:
        if self._needs_block(seq):
            seq.block_table.append(self._take())

    def trim(self) -> None:
        """The model is idle: unmaps mapped pages no live block touches (mapped ahead by a check
        that no allocation followed) and gives the spare pages back to the device's ledger."""
        for p in range(self.pool.num_pages):
            if self._use[p] == 0 and self.pool.is_mapped(p):
                self._unmap(p)
        self.pool.drain()

    def refill(self) -> None:
        """Tops up the spare pages (between steps, off a step's critical path)."""
        self.pool.refill()

    # ---- blocks by id, for holders other than the scheduler's sequences (Weaver's receiver) ----
    def take(self, n: int) -> list[int] | None:
        """n blocks, their pages mapped (drawn from the ledger); None, and nothing taken, if the
        budget cannot back them all."""
        if not self._ensure(n):
            return None
        return [self._take() for _ in range(n)]

    def give(self, blocks: list[int]) -> None:
        """Frees `blocks`; pages no live block touches any more are unmapped."""
        for b in blocks:
            self._free.add(b)
            emptied = False
            for p in self._pages(b):
                self._use[p] -= 1
                if self._use[p] == 0:
                    self._unmap(p)
                    emptied = True
            if not emptied:
                self._ready.add(b)

    # ---- elastic ----
    def pages_in_use(self) -> int:
        """Pages under at least one live block (what the ledger must hold, spares aside)."""
        return sum(1 for u in self._use if u)

    def pages_of(self, blocks: list[int]) -> set[int]:
        return {p for b in blocks for p in self._pages(b)}

    def _needs_block(self, seq: Sequence) -> bool:
        return len(seq) > len(seq.block_table) * self.block_size

    def _pages(self, b: int) -> range:
        start, page = b * self.block_bytes, self.pool.page_bytes
        return range(start // page, (start + self.block_bytes - 1) // page + 1)

    def _blocks_on(self, p: int) -> range:
        page = self.pool.page_bytes
        last = ((p + 1) * page - 1) // self.block_bytes
        return range(p * page // self.block_bytes, min(last + 1, self.num_blocks))

    def _map(self, p: int) -> None:
        self.pool.map(p)  # OutOfPages leaves the page unmapped
        heapq.heappop(self._unmapped)
        for b in self._blocks_on(p):
            if b in self._free and all(self.pool.is_mapped(q) for q in self._pages(b)):
                self._ready.add(b)

    def _unmap(self, p: int) -> None:
        self.pool.unmap(p)
        heapq.heappush(self._unmapped, p)
        self._ready.difference_update(self._blocks_on(p))

    def _ensure(self, n: int) -> bool:
        """Maps pages until n free blocks lie on mapped pages; False (and nothing newly mapped
        left behind) if the budget runs out first."""
        mapped_now: list[int] = []
        while len(self._ready) < n:
            if not self._unmapped or not self._blocks_on(self._unmapped[0]):
                break
            p = self._unmapped[0]
            try:
                self._map(p)
            except OutOfPages:
                break
            mapped_now.append(p)
        if len(self._ready) >= n:
            return True
        for p in mapped_now:
            self._unmap(p)
        return False

    def _take(self) -> int:
        if not self._ready:
            raise OutOfPages("no free block on a mapped page: check can_allocate/can_append first")
        b = max(self._ready, key=lambda b: (max(self._use[p] for p in self._pages(b)), -b))
        self._ready.remove(b)
        self._free.remove(b)
        for p in self._pages(b):
            self._use[p] += 1
        return b
