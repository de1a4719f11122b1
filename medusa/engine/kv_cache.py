"""The KV cache's device memory and its block manager, one class per kind of memory, chosen by
`kv_memory` from a registry: the engine registers "static" (one allocation of every block, all
backed from the start); medusa.plugins registers Prism's "elastic" (medusa.prism.kv_cache).
Every kind has one layout, block-major: [block][layer][k|v][slot][kv head][dim], so a block is
one contiguous run of bytes holding its tokens' K and V in every layer (720 KiB for SmolLM2 in
float32)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from medusa.engine.block_manager import BlockManager, Blocks
from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.sampling import SamplingParams
from medusa.engine.sequence import Sequence


class KVCache(ABC):
    buffer: Buffer  # the range the kernels index
    blocks: Blocks
    # Whether creating one needs only address space, its pages mapped as blocks are used (a
    # restore then starts with less memory free than the artifact's KV cache had).
    maps_on_demand: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def create(
        cls, config: EngineConfig, dev: Device, num_blocks: int, block_bytes: int
    ) -> KVCache:
        """A cache of `num_blocks` blocks of `block_bytes` for an engine of `config`."""

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
            raise RuntimeError("no KV block is free for a probe")
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

    @classmethod
    def create(
        cls, config: EngineConfig, dev: Device, num_blocks: int, block_bytes: int
    ) -> StaticKV:
        return cls(dev, num_blocks, config.block_size, block_bytes)

    def release(self) -> None:
        self.dev.free(self.buffer)

    def describe(self) -> dict[str, int | str]:
        return {"memory": "static"}


_KINDS: dict[str, type[KVCache]] = {}


def register_kv_cache(kind: str, cls: type[KVCache]) -> None:
    """Makes `cls` the KV cache of engines whose config says kv_memory=`kind`."""
    _KINDS[kind] = cls


def kv_cache_class(kind: str) -> type[KVCache]:
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(
            f"kv_memory={kind!r}: no KV cache of that kind is registered in this process "
            f"(registered: {', '.join(sorted(_KINDS))}); call medusa.plugins.register() before "
            "building the engine (it registers the research systems' plug-ins)"
        )
    return cls


def make_kv_cache(config: EngineConfig, dev: Device, num_blocks: int, block_bytes: int) -> KVCache:
    return kv_cache_class(config.kv_memory).create(config, dev, num_blocks, block_bytes)


register_kv_cache("static", StaticKV)
