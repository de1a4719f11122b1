"""Weaver in the cold engine, a step hook of it (medusa.engine.step_hooks) while it receives:
while it serves its own model, it polls a hot engine's exchange region at its kernel boundaries,
and between requests when it has none (the hook's idle poll), and runs the offloaded attention
there (`WeaverReceiver`).

The model runner's device is wrapped so that every eager kernel, GEMM and graph launch is followed
by one poll. A decode graph is one launch with one poll after it, and the hot engine could wait a
whole cold decode step (a host node after each kernel node could poll inside the graph, but it
would call back into Python from the device's thread at every kernel). So, by default
(`per_kernel`), the cold engine decodes eagerly while it is paired: a poll after each of its
kernels, as the paper's polling kernel after each pre-issued kernel gives (the cold model gives up
what its graphs save, about 5% on simcuda), and its graphs come back when the pairing ends. On a
GPU the paper's way is `csrc/kernels/cuda/weaver.cu`'s polling kernel captured after each kernel
node of the graph."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from medusa.engine.device import Device
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.step_hooks import StepHook
from medusa.prism.kv_cache import ElasticKV
from medusa.weaver.kv import ElasticOffloadedKV, OffloadedKV, StaticOffloadedKV
from medusa.weaver.receiver import WeaverReceiver
from medusa.weaver.region import ExchangeRegion


def receive(
    engine: LLMEngine, region: str | Path, num_blocks: int, dir_fd: int | None = None
) -> ColdWeaving:
    """Between steps: `engine` serves a hot engine's region between its own kernels, with
    `num_blocks` KV blocks of its device for the offloaded sequences, until the hot one ends the
    pairing or stop_receiving. dir_fd: the region's directory, opened (region is a name there)."""
    serving = cold_weaving(engine)
    if serving is not None:
        raise RuntimeError(f"already serving {serving.region.path}")
    return ColdWeaving(engine, region, num_blocks, dir_fd=dir_fd)


def stop_receiving(engine: LLMEngine) -> None:
    """Between steps: stops serving the region (what the receiver held is lost)."""
    serving = cold_weaving(engine)
    if serving is not None:
        serving.close()


def cold_weaving(engine: LLMEngine) -> ColdWeaving | None:
    """The region `engine` serves as the cold side, if it serves one."""
    return next((h for h in engine.hooks if isinstance(h, ColdWeaving)), None)


class PollingDevice:
    """A Device that polls a receiver after each unit of work it issues (never while capturing:
    the receiver's own kernels must not land in a graph)."""

    def __init__(self, device: Device, receiver: WeaverReceiver) -> None:
        self.device, self.receiver = device, receiver
        self.stopped = False  # the sender asked to stop: no more polling
        self._capturing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)

    def poll(self) -> None:
        if not self.stopped and not self._capturing:
            self.stopped = not self.receiver.poll()

    def launch(self, kernel: str, *args: int | float, **kw: Any) -> None:
        self.device.launch(kernel, *args, **kw)
        self.poll()

    def linear(self, *args: int, **kw: Any) -> None:
        self.device.linear(*args, **kw)
        self.poll()

    def hybrid_linear(self, *args: Any) -> None:
        self.device.hybrid_linear(*args)
        self.poll()

    def replay(self, exec_: int) -> None:
        self.device.replay(exec_)
        self.poll()

    def begin_capture(self) -> None:
        self._capturing = True
        self.device.begin_capture()

    def end_capture(self) -> int:
        self._capturing = False
        return self.device.end_capture()


class ColdWeaving(StepHook):
    """Makes `engine` (started) the receiver of the region at `path`: `num_blocks` KV blocks of
    `block_size` tokens (the hot model's layers and heads) of its device hold the offloaded
    sequences, pages of its elastic KV's budget if it has one (medusa.weaver.kv). Ends with
    `close` (or the engine's shutdown), which gives the engine its plain device back and the
    blocks' memory."""

    def __init__(
        self,
        engine: LLMEngine,
        path: str | Path,
        num_blocks: int,
        block_size: int | None = None,
        *,
        per_kernel: bool = True,
        dir_fd: int | None = None,
    ) -> None:
        """dir_fd: the region's directory, opened (path is then a name there)."""
        self.engine = engine
        self.region = ExchangeRegion(path, dir_fd=dir_fd)
        bs = block_size or engine.config.block_size
        kv: OffloadedKV | None = None
        try:
            kv = self._offloaded_kv(num_blocks, bs)
            self.receiver = WeaverReceiver(self.region, engine.device, num_blocks, bs, kv)
        except BaseException:
            if kv is not None:
                kv.close()
            self.region.close()
            raise
        self.device = PollingDevice(engine.device, self.receiver)
        self._per_kernel = per_kernel
        self._graphs: dict[int, int] = {}
        self._prefill: dict[int, int] = {}
        engine.add_hook(self)

    def attach(self, engine: LLMEngine) -> None:
        engine.runner.dev = self.device  # type: ignore[assignment]
        self._graphs = dict(engine.runner.graphs)
        self._prefill = dict(engine.runner.prefill.graphs)
        if self._per_kernel:  # eager steps: a poll after every kernel, none after whole graphs
            engine.runner.graphs.clear()
            engine.runner.prefill.graphs.clear()

    def detach(self) -> None:
        self.engine.runner.dev = self.device.device
        self.engine.runner.graphs.update(self._graphs)
        self.engine.runner.prefill.graphs.update(self._prefill)
        self.receiver.close()
        self.region.close()

    @property
    def polls_when_idle(self) -> bool:
        return not self.stopped

    def poll_idle(self) -> None:
        self.device.poll()

    @property
    def finished(self) -> bool:
        return self.stopped

    def _offloaded_kv(self, num_blocks: int, bs: int) -> OffloadedKV:
        """The receiver's blocks: drawn from the engine's elastic KV pages and ledger if it has
        them, else one allocation set aside now. MemoryError (the worker answers 409) if the
        device cannot hold them, or with elastic KV not even one offloaded sequence."""
        g, cache = self.region.geometry, self.engine.runner.kv_cache
        block_bytes = 2 * g.num_layers * bs * g.kv_size * 4
        if isinstance(cache, ElasticKV):
            ledger = cache.ledger.path if cache.ledger is not None else None
            name = f"{Path(self.engine.config.model or 'model').name}:{os.getpid()}"
            return ElasticOffloadedKV(cache.pool.vmm, num_blocks, bs, block_bytes, ledger=ledger,
                                      name=name, min_blocks=-(-g.max_tokens // bs))  # fmt: skip
        need, (free, _) = num_blocks * block_bytes, self.engine.device.mem_info()
        if need > free:
            raise MemoryError(
                f"{num_blocks} KV blocks for the offloaded sequences need {need / 2**20:.0f} MiB, "
                f"the device has {free / 2**20:.0f} MiB free: pair a less loaded worker, or fewer "
                "blocks"
            )
        return StaticOffloadedKV(self.engine.device, num_blocks, block_bytes)

    @property
    def stopped(self) -> bool:
        return self.device.stopped

    def run(self, idle: float = 50e-6) -> None:
        """Steps the engine while it has requests (polling between its kernels) and polls alone
        while it is idle; returns when the sender stops the pairing."""
        while not self.stopped:
            if self.engine.has_unfinished():
                self.engine.step()
            else:
                self.engine.poll_idle()
                time.sleep(idle)

    def close(self) -> None:
        self.engine.remove_hook(self)
