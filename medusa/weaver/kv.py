"""The receiver's KV blocks for a hot model's offloaded sequences, in the receiver's device memory.

- static: one allocation of every block, set aside when the pairing starts (a cold worker with
  static KV);
- elastic: a cold worker with elastic KV (Prism) draws them from the same device's page budget as
  its own cache: a reserved range whose pages are mapped under live blocks and unmapped when their
  last block goes, each page counted in the device's ledger on a row of the worker's own
  ("<worker>:weaver", its pid: the gateway counts it with the worker's model). A sequence that
  finishes gives its pages back at once; the pairing's end gives back the row.

Blocks are the model runner's layout, [block][layer][k|v][slot][kv head][dim], so one block is one
contiguous run of `block_bytes` and the kernels index them from `base`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from medusa.engine.device import Device
from medusa.prism.blocks import ElasticBlockManager
from medusa.prism.ledger import PageLedger
from medusa.prism.pages import PagePool
from medusa.prism.vmm import Vmm


class OffloadedKV(ABC):
    base: int  # device address of block 0
    num_blocks: int

    @abstractmethod
    def take(self, n: int) -> list[int] | None:
        """n free blocks, or None (and nothing taken) if there are not that many."""

    @abstractmethod
    def give(self, blocks: list[int]) -> None: ...

    @abstractmethod
    def num_free(self) -> int:
        """Blocks that can be taken now."""

    @abstractmethod
    def close(self) -> None:
        """Gives every block's memory back (the pairing ended)."""

    def describe(self) -> dict[str, int | str]:
        return {"memory": "static"}


class StaticOffloadedKV(OffloadedKV):
    def __init__(self, dev: Device, num_blocks: int, block_bytes: int) -> None:
        self.dev, self.num_blocks = dev, num_blocks
        self._buf = dev.alloc(num_blocks * block_bytes)
        self.base = self._buf.ptr
        self._free = list(range(num_blocks - 1, -1, -1))

    def take(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def give(self, blocks: list[int]) -> None:
        self._free += reversed(blocks)

    def num_free(self) -> int:
        return len(self._free)

    def close(self) -> None:
        self.dev.free(self._buf)


class ElasticOffloadedKV(OffloadedKV):
    """`num_blocks` blocks of address space; pages only under live blocks, from `ledger` (a path,
    or None: bounded by the device's memory alone). MemoryError if the budget has not the pages of
    `min_blocks` blocks now (one sequence at its longest), so a pairing that could not hold a
    single sequence is refused rather than failing at its first task."""

    def __init__(
        self,
        vmm: Vmm,
        num_blocks: int,
        block_size: int,
        block_bytes: int,
        *,
        ledger: str | Path | None,
        name: str,
        min_blocks: int = 1,
    ) -> None:
        page = vmm.granularity
        self.num_blocks = num_blocks
        need = -(-min(min_blocks, num_blocks) * block_bytes // page) + 1  # a block may straddle
        self.ledger: PageLedger | None = None
        if ledger:
            self.ledger = PageLedger(ledger)
            free = self.ledger.free()
            if free < need:
                self.ledger.close()
                raise MemoryError(
                    f"the device's page ledger {ledger} has {free} of {self.ledger.capacity} "
                    f"pages free; holding one offloaded sequence needs {need}: pair a worker on "
                    "a device with free KV memory"
                )
            self.ledger.join(f"{name}:weaver")
        self.pool = PagePool(vmm, -(-num_blocks * block_bytes // page), ledger=self.ledger, spare=0)
        self.base = self.pool.base
        self.blocks = ElasticBlockManager(self.pool, block_size, block_bytes, num_blocks)

    def take(self, n: int) -> list[int] | None:
        return self.blocks.take(n)

    def give(self, blocks: list[int]) -> None:
        self.blocks.give(blocks)

    def num_free(self) -> int:
        return self.blocks.num_free_blocks

    @property
    def num_pages(self) -> int:
        """Pages held now (each counted in the ledger)."""
        return self.pool.num_held

    def close(self) -> None:
        self.pool.close()
        if self.ledger is not None:
            self.ledger.leave()
            self.ledger.close()

    def describe(self) -> dict[str, int | str]:
        return {"memory": "elastic", "pages": self.num_pages, "page_bytes": self.pool.page_bytes}
