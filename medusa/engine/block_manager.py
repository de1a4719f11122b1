"""Paged KV-cache blocks: which are free, which sequence holds which. Touches no device memory."""

from __future__ import annotations

from collections import deque
from typing import Protocol

from medusa.engine.sequence import Sequence


class Blocks(Protocol):
    """What the scheduler needs of a block manager: this one, or Prism's elastic one."""

    block_size: int
    num_blocks: int

    @property
    def num_free_blocks(self) -> int: ...
    def can_allocate(self, seq: Sequence) -> bool: ...
    def allocate(self, seq: Sequence) -> None: ...
    def deallocate(self, seq: Sequence) -> None: ...
    def can_append(self, seq: Sequence) -> bool: ...
    def may_append(self, seq: Sequence) -> None: ...
    def trim(self) -> None: ...
    def refill(self) -> None: ...


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.num_blocks = num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def can_allocate(self, seq: Sequence) -> bool:
        return seq.num_blocks(self.block_size) <= len(self.free_blocks)

    def allocate(self, seq: Sequence) -> None:
        for _ in range(seq.num_blocks(self.block_size) - len(seq.block_table)):
            seq.block_table.append(self.free_blocks.popleft())

    def deallocate(self, seq: Sequence) -> None:
        self.free_blocks.extend(reversed(seq.block_table))
        seq.block_table.clear()

    def _needs_block(self, seq: Sequence) -> bool:
        # The newest token (not yet in the cache) must have a slot.
        return len(seq) > len(seq.block_table) * self.block_size

    def can_append(self, seq: Sequence) -> bool:
        return not self._needs_block(seq) or bool(self.free_blocks)

    def may_append(self, seq: Sequence) -> None:
        if self._needs_block(seq):
            seq.block_table.append(self.free_blocks.popleft())

    def trim(self) -> None:
        """Nothing to give back: a static cache keeps its memory."""

    def refill(self) -> None:
        """Nothing to prepare: every block is always backed."""
