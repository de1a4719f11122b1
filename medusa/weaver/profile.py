"""What the gateway needs to choose a Weaver receiver (medusa.weaver.choice), measured by a worker
on its own device once, between two steps:

- `ops`: the seconds of each kernel of an eager decode step of one sequence. A paired cold engine
  decodes eagerly and polls after each kernel (medusa.weaver.cold), so these are the
  operators T_i a hot worker's task can land in;
- `attention`: the seconds of one layer's attention over `max_num_seqs` sequences of one block
  each, the hot side's K + N at its batch (a share `ratio` of it goes to the receiver).

Each kernel is timed to its end (a synchronize after it), on the engine's plain device."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from medusa.engine.device import Device
from medusa.engine.model_runner import ModelRunner
from medusa.prism.kv_cache import ElasticKV
from medusa.weaver.choice import WeavingProfile

ATTENTION = "paged_attention_kernel"


class _TimingDevice:
    """Times each kernel, GEMM and graph launch to its end."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.times: list[tuple[str, float]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)

    def _timed(self, name: str, fn: Any, *args: Any, **kw: Any) -> None:
        self.device.synchronize()
        t0 = time.perf_counter()
        fn(*args, **kw)
        self.device.synchronize()
        self.times.append((name, time.perf_counter() - t0))

    def launch(self, kernel: str, *args: Any, **kw: Any) -> None:
        self._timed(kernel, self.device.launch, kernel, *args, **kw)

    def linear(self, *args: Any, **kw: Any) -> None:
        self._timed("linear", self.device.linear, *args, **kw)

    def hybrid_linear(self, *args: Any) -> None:
        self._timed("hybrid_linear", self.device.hybrid_linear, *args)


def measure(runner: ModelRunner) -> WeavingProfile:
    """Two eager decode steps on a scratch block (never a live sequence's): one sequence, kernel
    by kernel, and max_num_seqs sequences for the attention."""
    if runner.kv_cache is None or runner.kv is None:
        raise RuntimeError("the KV cache is not allocated yet")
    given = runner.dev
    plain = getattr(given, "device", given)  # a paired cold engine's PollingDevice: unwrapped
    bs, wide = runner.config.block_size, runner.config.max_num_seqs
    timing = _TimingDevice(plain)
    runner.dev = timing  # type: ignore[assignment]
    try:
        with runner.kv_cache.scratch_block() as block:
            one = _step(runner, timing, 1, block, bs)
            many = _step(runner, timing, wide, block, bs)
    finally:
        runner.dev = given  # NOTE: a paired cold engine polls again after each kernel
    attention = [t for name, t in many if name == ATTENTION]
    return WeavingProfile(tuple(t for _, t in one), float(np.mean(attention)) if attention else 0.0)


def _step(
    runner: ModelRunner, timing: _TimingDevice, size: int, block: int, bs: int
) -> list[tuple[str, float]]:
    batch = runner.batches.padding(size)
    batch.seq_lens[:] = bs  # every row attends over the scratch block's bs tokens
    batch.positions[:] = bs - 1
    batch.block_tables[:, 0] = block
    batch.slots[:] = block * bs + bs - 1
    timing.times = []
    runner.run_batch(batch, runner.kv, runner.ws["tokens"])
    return timing.times


def free_bytes(runner: ModelRunner, device: Device) -> int:
    """Memory a receiver here could hold offloaded KV in: the page ledger's free pages if the KV is
    elastic on a shared device, else the device's free memory."""
    cache = runner.kv_cache
    if isinstance(cache, ElasticKV) and cache.ledger is not None:
        return cache.ledger.free() * cache.ledger.page_bytes
    return device.mem_info()[0]
