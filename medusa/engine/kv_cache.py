"""The KV cache's device memory and its block manager. One layout for both kinds, block-major:
[block][layer][k|v][slot][kv head][dim], so a block is one contiguous run of bytes holding its
tokens' K and V in every layer (720 KiB for SmolLM2 in float32).

- static: one allocation of every block, all backed from the start;
- elastic (Prism): a reserved virtual range of the same size whose pages are mapped under live
  blocks and unmapped when they empty, each page drawn from the device's page ledger
  (MEDUSA_KV_LEDGER) when workers share a device, else bounded by the range alone. The range
  never moves, so captured graphs stay valid while pages come and go."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from medusa import env
from medusa.engine.block_manager import BlockManager, Blocks
from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.sampling import SamplingParams
from medusa.engine.sequence import Sequence
from medusa.prism.blocks import ElasticBlockManager
from medusa.prism.ledger import PageLedger
from medusa.prism.pages import OutOfPages, PagePool
from medusa.prism.vmm import Vmm

SPARE_PAGES = 2  # pages kept created but unmapped while busy, so a map skips cuMemCreate


class KVCache(ABC):
    buffer: Buffer  # the range the kernels index
    blocks: Blocks

    @abstractmethod
    def release(self) -> None:
        """Gives the memory back (and the ledger row, for an elastic cache)."""

    @abstractmethod
    def describe(self) -> dict[str, int | str]:
        """The artifact's KV section beyond the block count and size."""

    @contextmanager
    def scratch_block(self) -> Iterator[int]:
        """A free block for a probe's tokens (mapped, if elastic), given back afterwards."""
        seq = Sequence([0], SamplingParams(), 0)
        if not self.blocks.can_allocate(seq):
            raise OutOfPages("no KV block is free for a probe")
        self.blocks.allocate(seq)
        try:
            yield seq.block_table[0]
        finally:
            self.blocks.deallocate(seq)
            if not self.busy():
                self.blocks.trim()

    def busy(self) -> bool:
        return self.blocks.num_free_blocks < self.blocks.num_blocks


class StaticKV(KVCache):
    def __init__(self, dev: Device, num_blocks: int, block_size: int, block_bytes: int) -> None:
        self.dev = dev
        self.buffer = dev.alloc(num_blocks * block_bytes)
        self.blocks = BlockManager(num_blocks, block_size)

    def release(self) -> None:
        self.dev.free(self.buffer)

    def describe(self) -> dict[str, int | str]:
        return {"memory": "static"}


class ElasticKV(KVCache):
    def __init__(
        self,
        dev: Device,
        num_blocks: int,
        block_size: int,
        block_bytes: int,
        *,
        ledger: str | Path | None,
        name: str,
    ) -> None:
        vmm = Vmm(dev.b)
        num_pages = -(-num_blocks * block_bytes // vmm.granularity)
        self.ledger: PageLedger | None = None
        if ledger:
            self.ledger = PageLedger(ledger)
            self.ledger.join(name)
        self.pool = PagePool(vmm, num_pages, ledger=self.ledger, spare=SPARE_PAGES)
        self.buffer = Buffer(self.pool.base, num_pages * vmm.granularity)
        self.elastic = ElasticBlockManager(self.pool, block_size, block_bytes, num_blocks)
        self.blocks = self.elastic

    def busy(self) -> bool:
        return self.elastic.pages_in_use() > 0

    def describe(self) -> dict[str, int | str]:
        pages = self.pool.num_pages
        return {
            "memory": "elastic",
            "reserve_bytes": self.buffer.nbytes,
            "page_bytes": self.pool.page_bytes,
            "budget_pages": min(pages, self.ledger.capacity) if self.ledger else pages,
        }

    def release(self) -> None:
        self.pool.close()
        if self.ledger is not None:
            self.ledger.leave()
            self.ledger.close()


def make_kv_cache(config: EngineConfig, dev: Device, num_blocks: int, block_bytes: int) -> KVCache:
    if config.kv_memory == "static":
        return StaticKV(dev, num_blocks, config.block_size, block_bytes)
    name = f"{Path(config.model or 'smollm2').name}:{os.getpid()}"
    return ElasticKV(
        dev, num_blocks, config.block_size, block_bytes, ledger=env.KV_LEDGER.get(), name=name
    )
