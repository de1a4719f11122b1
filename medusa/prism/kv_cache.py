"""Prism's elastic KV cache, the engine's kv_memory="elastic" (medusa.plugins registers it with the
engine's KV-cache registry): a reserved virtual range of the static cache's size
and layout (medusa.engine.kv_cache) whose pages are mapped under live blocks and unmapped when
they empty, each page drawn from the device's page ledger (MEDUSA_KV_LEDGER) when workers share
a device, else bounded by the range alone. The range never moves, so captured graphs stay valid
while pages come and go."""

from __future__ import annotations

import os
from pathlib import Path

from medusa import env
from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.kv_cache import KVCache
from medusa.prism.blocks import ElasticBlockManager
from medusa.prism.ledger import PageLedger
from medusa.prism.pages import PagePool
from medusa.prism.vmm import Vmm

SPARE_PAGES = 2  # pages kept created but unmapped while busy, so a map skips cuMemCreate


class ElasticKV(KVCache):
    maps_on_demand = True

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

    @classmethod
    def create(
        cls, config: EngineConfig, dev: Device, num_blocks: int, block_bytes: int
    ) -> ElasticKV:
        """Joins the ledger MEDUSA_KV_LEDGER names, if any, as this model's worker."""
        name = f"{Path(config.model or 'smollm2').name}:{os.getpid()}"
        return cls(
            dev, num_blocks, config.block_size, block_bytes, ledger=env.KV_LEDGER.get(), name=name
        )

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
