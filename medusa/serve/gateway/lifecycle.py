"""The life of the gateway's workers: started on a free slice (or taken from the warm pool, or
placed on an elastic slice) with the container entrypoint (`medusa run`), health-checked until
ready, replaced by a migration, drained and stopped, reaped. What to start or stop, and when, is
the instance manager's (medusa.serve.gateway.instances) and its policy's."""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Coroutine

import httpx

from medusa.engine.loader import DEFAULT_MODEL
from medusa.serve.gateway.backends import WorkerBackend
from medusa.serve.gateway.config import ModelConfig
from medusa.serve.gateway.errors import NoCapacity
from medusa.serve.gateway.host_weights import HostWeights
from medusa.serve.gateway.instance import Instance, State
from medusa.serve.gateway.placement import group_of
from medusa.serve.gateway.pool import Assigned, PooledWorker, WarmPool
from medusa.serve.gateway.sharing import Choice, Sharing
from medusa.serve.gateway.slices import Slice, slice_group
from medusa.serve.gateway.start_log import StartLog
from medusa.serve.gateway.start_policy import StartPolicy
from medusa.serve.gateway.weaving import WeavingPairs
from medusa.serve.gateway.worker_handle import WorkerHandle
from medusa.serve.gateway.worker_link import NotOurWorker

log = logging.getLogger("medusa.gateway")


class WorkerLifecycle:
    def __init__(
        self,
        models: dict[str, ModelConfig],
        slices: list[Slice],
        backend: WorkerBackend,
        sharing: Sharing,
        *,
        on_ready: Callable[[Instance], Awaitable[None]] | None,
        pool_size: Callable[[str], int],
        startup_timeout: float,
        drain_timeout: float,
    ) -> None:
        self.models, self.slices, self.backend, self.sharing = models, slices, backend, sharing
        self.instances: dict[str, list[Instance]] = {m: [] for m in models}
        self.policy = StartPolicy(models)
        self.closing = False
        self.changed = asyncio.Condition()  # notified when a worker is ready, failed or stopped
        self._on_ready = on_ready
        self.startup_timeout, self.drain_timeout = startup_timeout, drain_timeout
        self._tasks: set[asyncio.Task[None]] = set()
        self._unreaped: set[WorkerHandle] = set()
        prepare = sorted({m.model or DEFAULT_MODEL for m in models.values()})
        one = [m for m in models.values() if m.tensor_parallel_size == 1]  # pooled ones' models
        self.pool = WarmPool(
            slices,
            pool_size,
            prepare,
            self.spawn,
            warm_timeout=startup_timeout,
            launch=lambda slc, args: self.backend.launch(slc, args, self.host_weights.pool_env()),
            prepare_artifacts=sorted({m.artifact for m in one if m.artifact}),
            busy=lambda: any(i.inflight for i in self.live()),
        )
        self.host_weights = HostWeights(models)
        self.weaving = WeavingPairs(models, enabled=self.backend.weaving)

    def live(self) -> list[Instance]:
        return [i for insts in self.instances.values() for i in insts if i.state != State.DEAD]

    def free_slice(self) -> Slice | None:
        return next((s for s in self.slices if not s.busy and not s.shared), None)

    def free_group(self, n: int) -> list[Slice] | None:
        """n slices of one class for a tensor-parallel worker (placement.group_of)."""
        pooled = [w.slice for w in self.pool.workers if w.proc.poll() is None]
        return group_of(n, self.slices, pooled)

    def spawn(self, task: Coroutine[object, object, None]) -> None:
        t = asyncio.get_running_loop().create_task(task)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def _args(self, model: str, slc: Slice) -> list[str]:
        cfg = self.models[model]
        return [*cfg.worker_args(self.sharing.worker_settings(slc)), "--served-model-name", model]

    # ---- starting ----
    def start(self, model: str, choice: Choice | None) -> Instance:
        """A worker of `model`: on `choice` (an elastic slice, room made there), else from the
        warm pool or on a free static slice; a tensor-parallel model's on a group of slices."""
        if self.models[model].tensor_parallel_size > 1:
            return self._start_group(model, self.models[model].tensor_parallel_size)
        if choice is not None and not self.sharing.make_room(model, choice, self.retire):
            raise NoCapacity(f"the pages of {model}'s weights are not free on {choice.slice.id}")
        pooled = self.pool.take(lambda s: s is choice.slice if choice else self.sharing.static(s))
        if pooled is not None:
            return self._start_pooled(model, pooled)
        slc = choice.slice if choice else self.free_slice()
        if slc is None:
            raise NoCapacity(f"no free slice for {model}")
        slc.busy = True
        return self._launch(model, slc)

    def _start_group(self, model: str, n: int) -> Instance:
        """One worker on n slices (one per rank), its ranks started at once by its rank 0; a
        pooled worker on one of them is stopped for it (a model never waits for the pool)."""
        group = self.free_group(n)
        if group is None:
            raise NoCapacity(f"{model} is tensor-parallel: it needs {n} free slices of one class")
        for slc in group:
            w = self.pool.take(functools.partial(operator.is_, slc))
            if w is not None:
                log.info("stopping the pooled worker on %s for %s", slc.id, model)
                self.spawn(w.proc.reap())
            slc.busy = True
        return self._launch(model, slice_group(group))

    def _launch(self, model: str, slc: Slice) -> Instance:
        proc = self.backend.launch(slc, self._args(model, slc), self.host_weights.worker_env(model))
        inst = Instance(model, slc, proc)
        self._unreaped.add(inst.proc)
        self.instances[model].append(inst)
        pid = f", worker pid {inst.proc.pid}" if inst.proc.pid else ""  # (a Ray actor's: later)
        log.info("starting %s on slice %s (%s back-end%s)", model, slc.id, self.backend.name, pid)
        self.spawn(self._wait_ready(inst))
        return inst

    def _start_pooled(self, model: str, w: PooledWorker) -> Instance:
        inst = Instance(model, w.slice, w.proc, pooled=True)
        self._unreaped.add(inst.proc)
        self.instances[model].append(inst)
        log.info("starting %s on %s from the warm pool (pid %d)", model, w.slice.id, w.proc.pid)
        args = self._args(model, w.slice)
        self.spawn(self._assign(inst, w, args))
        return inst

    async def _assign(self, inst: Instance, w: PooledWorker, args: list[str]) -> None:
        checked = self.host_weights.vouched(inst.model)
        try:
            args, checked = await self.backend.assignment(w.proc, args, checked)
        except ValueError as e:  # an artifact that cannot reach the worker's node
            done = Assigned(str(e), {}, {})
        else:
            finished = asyncio.Event()
            watch = asyncio.create_task(StartLog(inst).watch(w.client, "/pool", finished))
            try:
                done = await self.pool.assign(w, args, self.startup_timeout, checked)
            finally:
                finished.set()
                await watch
        if inst.state == State.STARTING:  # else stopped while it started (the gateway shuts down)
            inst.stages, inst.timings = done.stages, done.timings
            if done.error is None and inst.proc.poll() is None:
                inst.started = time.monotonic() - done.stages["ready"]
                await self._ready(inst)
            else:
                await self._start_failed(inst, done.error or inst.proc.last_error())
            await self.notify()
        # NOTE: refill after the start, and once the requests waiting for it have gone on: a
        # worker warming up would take CPU from the start, and spawning one holds the loop.
        await asyncio.sleep(0.05)
        self.pool.fill()

    async def _wait_ready(self, inst: Instance) -> None:
        health, impostor = await self._poll_health(inst)
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
        await self.notify()

    async def _poll_health(self, inst: Instance) -> tuple[httpx.Response | None, str | None]:
        """Its /health once it answers 200 or 500 (else None), or why it is not our worker."""
        deadline = time.monotonic() + self.startup_timeout
        health, impostor = None, None
        placed = await inst.proc.placed(self.startup_timeout)
        stages = StartLog(inst)
        while placed and inst.proc.poll() is None and inst.state == State.STARTING:
            try:
                r = await inst.client.get("/health", timeout=2.0)
                health = r if r.status_code in (200, 500) else None
                stages.saw(r)
            except NotOurWorker as e:
                impostor = str(e)
            except httpx.TransportError:
                pass
            if health is not None or impostor is not None or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        return health, impostor

    async def _start_failed(self, inst: Instance, why: str) -> None:
        self.retire(inst)  # (a migration's old worker, inst.replaces, goes on serving)
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
            self.spawn(self.stop(old))
        if self._on_ready:
            await self._on_ready(inst)

    # ---- stopping ----
    def retire(self, inst: Instance) -> None:
        """Stops routing to `inst` and frees its slice; its process is reaped in the background."""
        if inst.state == State.DEAD:
            return
        inst.state = State.DEAD
        for slc in inst.slice.held:
            slc.busy = False
        self.sharing.release(inst.slice, inst.model)
        if inst in self.instances[inst.model]:
            self.instances[inst.model].remove(inst)
        self.spawn(self._reap(inst.proc))
        if not self.closing:
            self.pool.fill()

    async def _reap(self, proc: WorkerHandle) -> None:
        await proc.reap()
        self._unreaped.discard(proc)

    async def stop(self, inst: Instance) -> None:
        """Drains `inst` (its requests get `drain_timeout` seconds), then retires it."""
        await self.weaving.release(inst)
        inst.state = State.DRAINING
        deadline = time.monotonic() + self.drain_timeout
        while inst.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.retire(inst)
        await self.notify()

    def mark_dead(self, inst: Instance) -> None:
        log.warning(
            "worker for %s on %s died (exit %s)", inst.model, inst.slice.id, inst.proc.poll()
        )
        self.retire(inst)

    def begin_shutdown(self) -> None:
        """No more starts; the starting workers retired, the others stopped in the background."""
        if self.closing:
            return
        self.closing = self.pool.closing = True
        for insts in self.instances.values():
            for inst in [i for i in insts if i.state == State.STARTING]:
                self.retire(inst)
        self.spawn(self.stop_all())

    async def stop_all(self) -> None:
        await self.notify()
        await asyncio.gather(
            *(self.stop(i) for insts in self.instances.values() for i in list(insts))
        )

    async def shutdown(self) -> None:
        """Every worker stopped and reaped (SIGKILL for one that ignores SIGTERM)."""
        self.begin_shutdown()
        await self.stop_all()
        await self.pool.shutdown()
        await self.host_weights.close()
        # NOTE: workers gone before their ledgers and the back-end's connection (a Ray actor
        # stops a worker; a ledger is removed through it).
        await asyncio.gather(*(self._reap(p) for p in list(self._unreaped)))
        self.sharing.close()
        await self.backend.close()
        for task in list(self._tasks):
            task.cancel()
