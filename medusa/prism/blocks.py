"""KV blocks in an elastic range: the BlockManager interface (the scheduler cannot tell them
apart), with pages mapped under the blocks as they are needed and unmapped when they empty.

Blocks are laid out block-major (one block holds its tokens' K and V for every layer), so one page
serves whole blocks of all layers and an idle model holds only the pages its live blocks touch:
kvcached maps one page id in every layer and in K and V, so a 2 MiB page costs 2 x layers pages.
New blocks go to the fullest partly-used page, so pages empty out and can be unmapped."""

from __future__ import annotations

from medusa.engine.sequence import Sequence
from medusa.prism.pages import OutOfPages, PagePool


class ElasticBlockManager:
    def __init__(self, pool: PagePool, block_size: int, block_bytes: int) -> None:
        if block_bytes <= 0 or block_bytes > pool.page_bytes:
            raise ValueError(
                f"a block of {block_bytes} bytes does not fit a {pool.page_bytes}-byte page"
            )
        self.pool, self.block_size, self.block_bytes = pool, block_size, block_bytes
        self.num_blocks = pool.num_pages * pool.page_bytes // block_bytes
        self._free = set(range(self.num_blocks))
        self._use = [0] * pool.num_pages  # allocated blocks touching each page

    # ---- the BlockManager interface ----
    @property
    def num_free_blocks(self) -> int:
        """Free blocks on mapped pages (more come with pages the budget may still give)."""
        return sum(1 for b in self._free if self._mapped(b))

    def can_allocate(self, seq: Sequence) -> bool:
        return self._ensure(seq.num_blocks(self.block_size) - len(seq.block_table))

    def allocate(self, seq: Sequence) -> None:
        for _ in range(seq.num_blocks(self.block_size) - len(seq.block_table)):
            seq.block_table.append(self._take())

    def deallocate(self, seq: Sequence) -> None:
        for b in seq.block_table:
            self._free.add(b)
            for p in self._pages(b):
                self._use[p] -= 1
                if self._use[p] == 0:
                    self.pool.unmap(p)
        seq.block_table.clear()

    def can_append(self, seq: Sequence) -> bool:
        return not self._needs_block(seq) or self._ensure(1)

    def may_append(self, seq: Sequence) -> None:
        if self._needs_block(seq):
            seq.block_table.append(self._take())

    # ---- elastic ----
    def pages_in_use(self) -> int:
        """Pages under at least one live block (what the ledger must hold, spares aside)."""
        return sum(1 for u in self._use if u)

    def trim(self) -> None:
        """Unmaps mapped pages no live block touches (mapped ahead by a check that was not
        followed by an allocation), and gives the spare pages back: the model is idle."""
        for p in range(self.pool.num_pages):
            if self._use[p] == 0 and self.pool.is_mapped(p):
                self.pool.unmap(p)
        self.pool.drain()

    def _needs_block(self, seq: Sequence) -> bool:
        return len(seq) > len(seq.block_table) * self.block_size

    def _pages(self, b: int) -> range:
        start, page = b * self.block_bytes, self.pool.page_bytes
        return range(start // page, (start + self.block_bytes - 1) // page + 1)

    def _mapped(self, b: int) -> bool:
        return all(self.pool.is_mapped(p) for p in self._pages(b))

    def _ensure(self, n: int) -> bool:
        """Maps pages until n free blocks lie on mapped pages; False (and nothing newly mapped
        left behind) if the budget runs out first."""
        ready = self.num_free_blocks
        mapped_now: list[int] = []
        for p in range(self.pool.num_pages):
            if ready >= n:
                return True
            if self.pool.is_mapped(p):
                continue
            try:
                self.pool.map(p)
            except OutOfPages:
                for q in mapped_now:
                    self.pool.unmap(q)
                return False
            mapped_now.append(p)
            ready = self.num_free_blocks
        return ready >= n

    def _take(self) -> int:
        ready = [b for b in self._free if self._mapped(b)]
        if not ready:
            raise OutOfPages("no free block on a mapped page: check can_allocate/can_append first")
        b = max(ready, key=lambda b: (max(self._use[p] for p in self._pages(b)), -b))
        self._free.remove(b)
        for p in self._pages(b):
            self._use[p] += 1
        return b
