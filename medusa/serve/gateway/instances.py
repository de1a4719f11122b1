"""Workers: started on free slices with the container entrypoint (`medusa run`), health-checked,
routed to least-loaded, scaled up by in-flight load and down after keep_alive."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine

import httpx

from medusa.engine.loader import DEFAULT_MODEL
from medusa.serve.gateway.backends import WorkerBackend, WorkerHandle
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
from medusa.serve.gateway.pool import Assigned, PooledWorker, WarmPool
from medusa.serve.gateway.sharing import Choice, Sharing
from medusa.serve.gateway.slices import Slice
from medusa.serve.gateway.start_policy import StartPolicy
from medusa.serve.gateway.weaving import WeavingPairs
from medusa.serve.gateway.worker_link import NotOurWorker

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
        self.instances: dict[str, list[Instance]] = {m: [] for m in models}
        self.waiting: dict[str, int] = {m: 0 for m in models}
        self.policy = StartPolicy(models)
        self.closing = False
        self._changed = asyncio.Condition()
        self._on_cold_start = on_cold_start
        self.startup_timeout, self.drain_timeout = startup_timeout, drain_timeout
        self._tasks: set[asyncio.Task[None]] = set()
        self._unreaped: set[WorkerHandle] = set()
        prepare = sorted({m.model or DEFAULT_MODEL for m in models.values()})
        self.pool = WarmPool(
            slices,
            pool_size,
            prepare,
            self._spawn,
            warm_timeout=startup_timeout,
            launch=lambda slc, args: self.backend.launch(slc, args, {}),
            prepare_artifacts=sorted({m.artifact for m in models.values() if m.artifact}),
            busy=lambda: any(i.inflight for i in self.live()),
        )
        self.host_weights = HostWeights(models)
        self.sharing = sharing or Sharing(
            GatewayConfig(models), slices, open_ledger=self.backend.open_ledger
        )
        self.weaving = WeavingPairs(models, enabled=self.backend.weaving)

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

    def free_slice(self) -> Slice | None:
        return next((s for s in self.slices if not s.busy and not s.shared), None)

    def can_place(self, model: str) -> bool:
        """A worker of `model` can start now: on an elastic slice with room for it, from the warm
        pool or on a free slice."""
        if self.sharing.choose(model, self.live(), self.waiting) is not None:
            return True
        return self.pool.available(self.sharing.static) or self.free_slice() is not None

    def live(self) -> list[Instance]:
        return [i for insts in self.instances.values() for i in insts if i.state != State.DEAD]

    def _args(self, model: str, slc: Slice) -> list[str]:
        cfg = self.models[model]
        return [*cfg.worker_args(), *self.sharing.worker_args(slc), "--served-model-name", model]

    def _spawn(self, task: Coroutine[object, object, None]) -> None:
        t = asyncio.get_running_loop().create_task(task)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ---- starting and stopping ----
    def start(self, model: str, choice: Choice | None = None) -> Instance:
        choice = choice or self.sharing.choose(model, self.live(), self.waiting)
        if choice is not None and not self.sharing.make_room(model, choice, self._retire):
            raise NoCapacity(f"the pages of {model}'s weights are not free on {choice.slice.id}")
        pooled = self.pool.take(lambda s: s is choice.slice if choice else self.sharing.static(s))
        if pooled is not None:
            return self._start_pooled(model, pooled)
        slc = choice.slice if choice else self.free_slice()
        if slc is None:
            raise NoCapacity(f"no free slice for {model}")
        slc.busy = True
        proc = self.backend.launch(slc, self._args(model, slc), self.host_weights.worker_env(model))
        inst = Instance(model, slc, proc)
        self._unreaped.add(inst.proc)
        self.instances[model].append(inst)
        log.info("starting %s on slice %s (%s back-end)", model, slc.id, self.backend.name)
        self._spawn(self._wait_ready(inst))
        return inst

    def _start_pooled(self, model: str, w: PooledWorker) -> Instance:
        inst = Instance(model, w.slice, w.proc, pooled=True)
        self._unreaped.add(inst.proc)
        self.instances[model].append(inst)
        log.info("starting %s on %s from the warm pool (pid %d)", model, w.slice.id, w.proc.pid)
        args = self._args(model, w.slice)
        self._spawn(self._assign(inst, w, args))
        return inst

    async def _assign(self, inst: Instance, w: PooledWorker, args: list[str]) -> None:
        checked = self.host_weights.vouched(inst.model)
        try:
            args, checked = await self.backend.assignment(w.proc, args, checked)
        except ValueError as e:  # an artifact that cannot reach the worker's node
            done = Assigned(str(e), {}, {})
        else:
            done = await self.pool.assign(w, args, self.startup_timeout, checked)
        if inst.state == State.STARTING:  # else stopped while it started (the gateway shuts down)
            inst.stages, inst.timings = done.stages, done.timings
            if done.error is None and inst.proc.poll() is None:
                inst.started = time.monotonic() - done.stages["ready"]
                await self._ready(inst)
            else:
                await self._start_failed(inst, done.error or inst.proc.last_error())
            await self._notify()
        # NOTE: refill after the start, and once the requests waiting for it have gone on: a
        # worker warming up would take CPU from the start, and spawning one holds the loop.
        await asyncio.sleep(0.05)
        self.pool.fill()

    async def _wait_ready(self, inst: Instance) -> None:
        deadline = time.monotonic() + self.startup_timeout
        health, impostor = None, None
        placed = await inst.proc.placed(self.startup_timeout)
        while placed and inst.proc.poll() is None and inst.state == State.STARTING:
            try:
                r = await inst.client.get("/health", timeout=2.0)
                health = r if r.status_code in (200, 500) else None
            except NotOurWorker as e:
                impostor = str(e)
            except httpx.TransportError:
                pass
            if health is not None or impostor is not None or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        if inst.state != State.STARTING:  # stopped while it started (the gateway shuts down)
            return
        if health is not None and health.status_code == 200 and inst.proc.poll() is None:
            await self._ready(inst)
        elif impostor is not None:
            await self._start_failed(inst, impostor)
        elif health is None and inst.proc.poll() is None:
            await self._start_failed(
                inst, f"it did not answer /health within {self.startup_timeout:.0f} s"
            )
        else:
            # NOTE: a worker whose engine failed exits with the reason as its last stderr line.
            await inst.proc.exited(5.0)
            await self._start_failed(inst, inst.proc.last_error())
        await self._notify()

    async def _start_failed(self, inst: Instance, why: str) -> None:
        self._retire(inst)  # (a migration's old worker, inst.replaces, goes on serving)
        failure = self.policy.start_failed(inst.model, why)
        if failure is not None:
            log.error("%s", failure.message)
        else:
            log.warning("%s: its worker failed to start (%s); trying again", inst.model, why)

    async def _ready(self, inst: Instance) -> None:
        inst.state = State.WARM
        inst.ready_seconds = time.monotonic() - inst.started
        inst.last_used = time.monotonic()
        self.policy.started(inst.model)
        # NOTE: once it serves, not before: reading the store in would take CPU from its start.
        self.host_weights.need(inst.model)
        log.info("%s ready on %s in %.2f s", inst.model, inst.slice.id, inst.ready_seconds)
        if inst.replaces is not None:  # migrated: the old worker finishes what it has, then goes
            old, inst.replaces = inst.replaces, None
            self._spawn(self.stop(old))
        if self._on_cold_start:
            await self._on_cold_start(inst)

    def _retire(self, inst: Instance) -> None:
        """Stops routing to `inst` and frees its slice; its process is reaped in the background."""
        if inst.state == State.DEAD:
            return
        inst.state = State.DEAD
        inst.slice.busy = False
        self.sharing.release(inst.slice, inst.model)
        if inst in self.instances[inst.model]:
            self.instances[inst.model].remove(inst)
        self._spawn(self._reap(inst.proc))
        if not self.closing:
            self.pool.fill()

    async def _reap(self, proc: WorkerHandle) -> None:
        await proc.reap()
        self._unreaped.discard(proc)

    async def stop(self, inst: Instance) -> None:
        await self.weaving.release(inst)
        inst.state = State.DRAINING
        deadline = time.monotonic() + self.drain_timeout
        while inst.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._retire(inst)
        await self._notify()

    def mark_dead(self, inst: Instance) -> None:
        log.warning(
            "worker for %s on %s died (exit %s)", inst.model, inst.slice.id, inst.proc.poll()
        )
        self._retire(inst)

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
        cfg = self.models[model]
        active = [i for i in self.instances[model] if i.state in (State.WARM, State.STARTING)]
        load = sum(i.inflight for i in active) + self.waiting[model]
        if len(active) < cfg.max_instances and (not active or load > cfg.target * len(active)):
            if self.can_place(model) and self.policy.can_start(model) and not self.closing:
                self.start(model)

    def _check_admission(self, model: str) -> None:
        if self.closing:
            raise ShuttingDown()
        failure = self.policy.failure(model)
        if failure is not None:
            raise StartFailed(failure)
        cfg, warm = self.models[model], self._warm(model)
        # Requests beyond `target` per warm instance wait in the worker: they count as queued.
        queued = self.waiting[model] + sum(i.inflight for i in warm) - cfg.target * len(warm)
        if queued >= cfg.max_queue:
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
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), timeout=min(left, 0.5))
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
                raise NoCapacity(f"no free slice to start {model} on")

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

    # ---- the autoscaler ----
    async def autoscale(self, period: float = 0.25) -> None:
        while not self.closing:
            self.backend.refresh(self.slices)
            self.sharing.follow(self.slices)
            self.pool.fill()
            self.host_weights.expire({m for m, insts in self.instances.items() if insts})
            await self.weaving.tick([i for insts in self.instances.values() for i in insts])
            now = time.monotonic()
            self._migrate(now)
            for model, cfg in self.models.items():
                warm = self._warm(model)
                active = len([i for i in self.instances[model] if i.state != State.DEAD])
                for inst in warm:
                    idle = now - inst.last_used
                    # NOTE: an idle worker on an elastic slice holds only its weights (its KV pages
                    # went back): it stays until placement evicts it for a model that needs room.
                    if inst.slice.shared:
                        continue
                    if inst.inflight == 0 and idle > cfg.keep_alive and active > cfg.min_instances:
                        log.info("scaling %s down (idle %.1f s)", model, idle)
                        active -= 1
                        await self.stop(inst)
                starting_or_warm = [
                    i for i in self.instances[model] if i.state in (State.WARM, State.STARTING)
                ]
                while (
                    len(starting_or_warm) < cfg.min_instances
                    and self.can_place(model)
                    and self.policy.can_start(model)
                    and not self.closing
                ):
                    starting_or_warm.append(self.start(model))
            await asyncio.sleep(period)

    # ---- shutting down ----
    def begin_shutdown(self) -> None:
        """On SIGTERM: refuse new and queued requests, stop starting workers, and give in-flight
        requests `drain_timeout` seconds before their workers are stopped too."""
        if self.closing:
            return
        self.closing = self.pool.closing = True
        for insts in self.instances.values():
            for inst in [i for i in insts if i.state == State.STARTING]:
                self._retire(inst)
        self._spawn(self._stop_all())

    async def _stop_all(self) -> None:
        await self._notify()
        await asyncio.gather(
            *(self.stop(i) for insts in self.instances.values() for i in list(insts))
        )

    async def shutdown(self) -> None:
        """Every worker stopped and reaped (SIGKILL for one that ignores SIGTERM)."""
        self.begin_shutdown()
        await self._stop_all()
        await self.pool.shutdown()
        await self.host_weights.close()
        # NOTE: workers gone before their ledgers and the back-end's connection (a Ray actor
        # stops a worker; a ledger is removed through it).
        await asyncio.gather(*(self._reap(p) for p in list(self._unreaped)))
        self.sharing.close()
        await self.backend.close()
        for task in list(self._tasks):
            task.cancel()
