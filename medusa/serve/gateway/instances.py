"""The gateway's workers per model: a request gets a slot on the least-loaded warm one (a Lease),
starting one if the autoscaling policy (medusa.serve.gateway.autoscaling) says so and waiting while
it starts; every `period` the manager scales down idle workers and up to `min_instances`, and
moves a model Prism's placement would put elsewhere. Starting and stopping a worker is its
lifecycle's (medusa.serve.gateway.lifecycle)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from medusa.serve.gateway import autoscaling
from medusa.serve.gateway.backends import WorkerBackend
from medusa.serve.gateway.backends.local import LocalBackend
from medusa.serve.gateway.config import GatewayConfig, ModelConfig
from medusa.serve.gateway.errors import (  # noqa: F401 - the gateway's errors, re-exported
    NoCapacity,
    QueueFull,
    ShuttingDown,
    StartFailed,
    Unavailable,
)
from medusa.serve.gateway.host_weights import HostWeights
from medusa.serve.gateway.instance import Instance, Lease, State
from medusa.serve.gateway.lifecycle import WorkerLifecycle
from medusa.serve.gateway.pool import WarmPool
from medusa.serve.gateway.sharing import Choice, Sharing
from medusa.serve.gateway.slices import Slice
from medusa.serve.gateway.start_policy import StartPolicy

log = logging.getLogger("medusa.gateway")


class InstanceManager:
    def __init__(
        self,
        models: dict[str, ModelConfig],
        slices: list[Slice],
        *,
        on_cold_start: Callable[[Instance], Awaitable[None]] | None = None,
        startup_timeout: float = 300.0,
        drain_timeout: float = 30.0,
        pool_size: Callable[[str], int] = lambda kind: 0,
        sharing: Sharing | None = None,
        backend: WorkerBackend | None = None,
    ) -> None:
        self.backend = backend or LocalBackend()
        self.models, self.slices = models, slices
        self.waiting: dict[str, int] = {m: 0 for m in models}
        self.sharing = sharing or Sharing(
            GatewayConfig(models), slices, open_ledger=self.backend.open_ledger
        )
        self.lifecycle = WorkerLifecycle(
            models,
            slices,
            self.backend,
            self.sharing,
            on_ready=on_cold_start,
            pool_size=pool_size,
            startup_timeout=startup_timeout,
            drain_timeout=drain_timeout,
        )

    # ---- what the lifecycle holds ----
    @property
    def instances(self) -> dict[str, list[Instance]]:
        return self.lifecycle.instances

    @property
    def pool(self) -> WarmPool:
        return self.lifecycle.pool

    @property
    def policy(self) -> StartPolicy:
        return self.lifecycle.policy

    @property
    def host_weights(self) -> HostWeights:
        return self.lifecycle.host_weights

    @property
    def closing(self) -> bool:
        return self.lifecycle.closing

    def live(self) -> list[Instance]:
        return self.lifecycle.live()

    def mark_dead(self, inst: Instance) -> None:
        self.lifecycle.mark_dead(inst)

    # ---- state ----
    def state(self, model: str) -> str:
        insts = [i for i in self.instances[model] if i.state != State.DEAD]
        if any(i.state == State.WARM for i in insts):
            return "warm"
        if any(i.state == State.STARTING for i in insts) or self.policy.backing_off(model):
            return "starting"
        if self.policy.failure(model):
            return "failed"
        if insts:
            return "draining"
        return "cold"

    def can_place(self, model: str) -> bool:
        """A worker of `model` can start now: on an elastic slice with room for it, from the warm
        pool or on a free slice; a tensor-parallel model's on n slices of one class."""
        n = self.models[model].tensor_parallel_size
        if n > 1:
            return self.lifecycle.free_group(n) is not None
        if self.sharing.choose(model, self.live(), self.waiting) is not None:
            return True
        return self.pool.available(self.sharing.static) or self.lifecycle.free_slice() is not None

    def start(self, model: str, choice: Choice | None = None) -> Instance:
        if self.models[model].tensor_parallel_size > 1:  # static slices only
            return self.lifecycle.start(model, None)
        choice = choice or self.sharing.choose(model, self.live(), self.waiting)
        return self.lifecycle.start(model, choice)

    def _may_start(self, model: str) -> bool:
        return self.can_place(model) and self.policy.can_start(model) and not self.closing

    # ---- routing ----
    def _warm(self, model: str) -> list[Instance]:
        live = []
        for i in list(self.instances[model]):
            if i.state == State.WARM and i.proc.poll() is not None:
                self.mark_dead(i)
            elif i.state == State.WARM:
                live.append(i)
        return live

    def _maybe_scale_up(self, model: str) -> None:
        active = [i for i in self.instances[model] if i.state in (State.WARM, State.STARTING)]
        load = sum(i.inflight for i in active) + self.waiting[model]
        if autoscaling.wants_another(self.models[model], len(active), load):
            if self._may_start(model):
                self.start(model)

    def _check_admission(self, model: str) -> None:
        if self.closing:
            raise ShuttingDown()
        failure = self.policy.failure(model)
        if failure is not None:
            raise StartFailed(failure)
        warm = self._warm(model)
        inflight = sum(i.inflight for i in warm)
        if autoscaling.queue_full(self.models[model], len(warm), inflight, self.waiting[model]):
            raise QueueFull(model)

    async def acquire(self, model: str, timeout: float) -> Lease:
        """A slot on the least-loaded warm instance, starting one if needed; waits while it
        starts. The caller releases the lease (in a `finally`)."""
        self._check_admission(model)
        self.sharing.rates.arrived(model)
        self.waiting[model] += 1
        try:
            self._maybe_scale_up(model)
            deadline = time.monotonic() + timeout
            while True:
                warm = self._warm(model)
                if warm:
                    inst = min(warm, key=lambda i: i.inflight)
                    inst.inflight += 1
                    inst.last_used = time.monotonic()
                    return Lease(inst, self.sharing.admit, self.sharing.done)
                self._refuse_if_hopeless(model)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoCapacity(f"{model} did not become ready in {timeout:.0f} s")
                changed = self.lifecycle.changed
                async with changed:
                    try:
                        await asyncio.wait_for(changed.wait(), timeout=min(left, 0.5))
                    except asyncio.TimeoutError:
                        pass
        finally:
            self.waiting[model] -= 1

    def _refuse_if_hopeless(self, model: str) -> None:
        """While a request waits: refuse it once no instance can come for it."""
        if self.closing:
            raise ShuttingDown()
        failure = self.policy.failure(model)
        if failure is not None:
            raise StartFailed(failure)
        if not [i for i in self.instances[model] if i.state == State.STARTING]:
            self._maybe_scale_up(model)
            if not self.instances[model] and not self.policy.backing_off(model):
                n = self.models[model].tensor_parallel_size
                need = f"{n} free slices of one class (tensor parallel)" if n > 1 else ""
                raise NoCapacity(f"no room to start {model} on: it needs {need or 'a free slice'}")

    # ---- the autoscaler ----
    async def autoscale(self, period: float = 0.25) -> None:
        while not self.closing:
            self.backend.refresh(self.slices)
            self.sharing.follow(self.slices)
            self.pool.fill()
            self.host_weights.expire({m for m, insts in self.instances.items() if insts})
            await self.lifecycle.weaving.tick(
                [i for insts in self.instances.values() for i in insts]
            )
            self._migrate(time.monotonic())
            for model in self.models:
                await self._scale(model)
            await asyncio.sleep(period)

    async def _scale(self, model: str) -> None:
        """Down: the workers idle past keep_alive; up: to min_instances."""
        cfg, now = self.models[model], time.monotonic()
        warm = self._warm(model)
        loads = [
            autoscaling.WorkerLoad(i.inflight, now - i.last_used, i.slice.shared) for i in warm
        ]
        num_live = len([i for i in self.instances[model] if i.state != State.DEAD])
        for k in autoscaling.to_stop(cfg, loads, num_live):
            inst = warm[k]
            if inst.inflight or inst.state != State.WARM:
                continue  # NOTE: a request came while an earlier one drained
            log.info("scaling %s down (idle %.1f s)", model, time.monotonic() - inst.last_used)
            await self.lifecycle.stop(inst)
        active = [i for i in self.instances[model] if i.state in (State.WARM, State.STARTING)]
        for _ in range(autoscaling.shortfall(cfg, len(active))):
            if not self._may_start(model):
                break
            self.start(model)

    def _migrate(self, now: float) -> None:
        """Prism's placement moves at most one model per call: its new worker restores on the
        slice that lowers its KV pressure, and the old one drains once the new one serves."""
        if any(i.replaces is not None and i.state == State.STARTING for i in self.live()):
            return  # one at a time
        move = self.sharing.migration(self.live(), now)
        if move is None:
            return
        old, target = move
        log.info(
            "migrating %s from %s to %s (lower KV pressure)", old.model, old.slice.id, target.id
        )
        try:
            self.start(old.model, Choice(target, [])).replaces = old  # type: ignore[assignment]
        except NoCapacity as e:
            log.info("not migrating %s: %s", old.model, e)

    # ---- shutting down ----
    def begin_shutdown(self) -> None:
        """On SIGTERM: refuse new and queued requests, stop starting workers, and give in-flight
        requests `drain_timeout` seconds before their workers are stopped too."""
        self.lifecycle.begin_shutdown()

    async def shutdown(self) -> None:
        """Every worker stopped and reaped (SIGKILL for one that ignores SIGTERM)."""
        await self.lifecycle.shutdown()
