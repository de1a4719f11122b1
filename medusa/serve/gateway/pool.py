"""The warm pool: per slice class, `warm_pool` workers started ahead (`medusa run --pool`) on free
slices. Each has done its imports, made its device context and loaded its kernels, and opened the
catalog's model files and tokenizers, but holds no model memory. A cold model takes one and has it
restore its artifact; the pool refills in the background and replaces pooled workers that die.

Pooled workers are started by the placement back-end (`launch`): processes here, or, with Ray, by
the slice actors on their nodes; a worker's address is known once it is placed.

NOTE: a pooled worker occupies its slice (its device context) while it waits: the pool only fills
slices no model uses, and never holds one back from a model that needs it (a model takes it)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field

import httpx

from medusa.serve.gateway.slices import Slice
from medusa.serve.gateway.worker_handle import WorkerAddress, WorkerHandle
from medusa.serve.gateway.worker_link import NotOurWorker

log = logging.getLogger("medusa.gateway")

Launch = Callable[[Slice, list[str]], WorkerHandle]  # starts `medusa run ARGS` on a slice
REFILL_WAIT = 10.0  # seconds a refill waits at most for no request to be in flight


@dataclass
class PooledWorker(WorkerAddress):
    slice: Slice
    proc: WorkerHandle  # its address: once placed
    started: float = field(default_factory=time.monotonic)
    idle: bool = False  # warmed up: a model can be assigned at once
    failed: str | None = None  # why its warm-up failed


@dataclass(frozen=True)
class Assigned:
    """What a pooled worker answered to its assignment."""

    error: str | None  # None: it serves the model
    stages: dict[str, float]  # the pooled start's stages, seconds (see WarmPool.assign)
    timings: dict[str, float]  # the engine's start-up stages


def _sum(timings: dict[str, float], *prefixes: str) -> float:
    return sum(v for k, v in timings.items() if k.startswith(prefixes))


class WarmPool:
    def __init__(
        self,
        slices: list[Slice],
        size: Callable[[str], int],
        prepare: list[str],
        spawn: Callable[[Coroutine[object, object, None]], None],
        *,
        launch: Launch,
        warm_timeout: float = 300.0,
        prepare_artifacts: list[str] | None = None,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        """prepare: the catalog's models, whose files and tokenizers a pooled worker opens ahead;
        prepare_artifacts: their artifacts, checked (and weight stores opened) ahead; busy:
        whether requests are in flight (the pool waits for a lull to refill)."""
        self.slices, self.size, self.prepare = slices, size, prepare
        self.prepare_artifacts = prepare_artifacts or []
        self._launch = launch
        self.workers: list[PooledWorker] = []
        self.closing = False
        self.warm_timeout = warm_timeout
        self._spawn = spawn
        self._retry_at: dict[str, float] = {}  # slice class -> when to try again after failures
        self._failures: dict[str, int] = {}
        self._assigning = 0  # starts under way: refills wait for them (they compete for CPU)
        self.busy = busy
        self._short_since = 0.0  # when a refill was first put off

    @property
    def enabled(self) -> bool:
        return any(self.size(s.kind) for s in self.slices)

    def num_workers(self, kind: str, *, idle: bool) -> int:
        return sum(
            1
            for w in self.workers
            if w.slice.kind == kind and w.idle == idle and w.proc.poll() is None
        )

    # ---- filling ----
    def fill(self) -> None:
        """Replaces pooled workers that died and starts new ones on free slices up to each
        class's size. Call it from the event loop's thread (workers die with that thread)."""
        for w in [w for w in self.workers if w.proc.poll() is not None or w.failed]:
            self._drop(w, w.failed or f"it exited ({w.proc.last_error()})")
        if self.closing or self._assigning:
            return
        now = time.monotonic()
        # NOTE: a warm-up takes CPU from the requests being answered (on the serverless bench's
        # trace, TPOT 342 ms while a pooled worker warmed against 220 ms otherwise): the pool
        # refills once no request is in flight, or REFILL_WAIT seconds after it could have.
        self._short_since = self._short_since or now
        if self.busy() and now - self._short_since < REFILL_WAIT:
            return
        for kind in {s.kind for s in self.slices}:
            have = sum(1 for w in self.workers if w.slice.kind == kind)
            free = [s for s in self.slices if s.kind == kind and not s.busy]
            if now < self._retry_at.get(kind, 0.0):
                continue
            for slc in free[: max(0, self.size(kind) - have)]:
                self._start(slc)
        self._short_since = 0.0

    def _start(self, slc: Slice) -> None:
        slc.busy = True
        args = ["--pool", *(a for m in self.prepare for a in ("--prepare", m))]
        args += [a for d in self.prepare_artifacts for a in ("--prepare-artifact", d)]
        w = PooledWorker(slc, self._launch(slc, args))
        self.workers.append(w)
        self._spawn(self._watch(w))

    async def _watch(self, w: PooledWorker) -> None:
        """Marks `w` idle once it has warmed up (or failed if it cannot)."""
        deadline = w.started + self.warm_timeout
        if not await w.proc.placed(self.warm_timeout):
            return  # it ended: fill() drops it, with why
        log.info("pool: warming a worker on slice %s (pid %d)", w.slice.id, w.proc.pid)
        while w.proc.poll() is None and time.monotonic() < deadline and not self.closing:
            try:
                r = await w.client.get("/pool", timeout=2.0)
                if r.status_code == 200:
                    w.idle = True
                    self._failures.pop(w.slice.kind, None)
                    log.info(
                        "pool: worker on %s warm in %.2f s",
                        w.slice.id,
                        time.monotonic() - w.started,
                    )
                    return
                if r.status_code == 500:
                    w.failed = f"its warm-up failed: {r.json().get('error')}"
                    break
            except NotOurWorker as e:
                w.failed = str(e)
                break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        if w.proc.poll() is None and not w.failed and not self.closing:
            w.failed = f"it did not warm up in {self.warm_timeout:.0f} s"

    def _drop(self, w: PooledWorker, why: str) -> None:
        """A pooled worker that died or cannot warm up: reap it, free its slice, back off."""
        self.workers.remove(w)
        w.slice.busy = False
        self._spawn(w.proc.reap())
        if self.closing:
            return
        n = self._failures[w.slice.kind] = self._failures.get(w.slice.kind, 0) + 1
        wait = min(60.0, 2.0 ** (n - 1))
        self._retry_at[w.slice.kind] = time.monotonic() + wait
        log.warning("pool: the worker on %s is gone (%s); next in %.0f s", w.slice.id, why, wait)

    # ---- taking ----
    def available(self, where: Callable[[Slice], bool] = lambda s: True) -> bool:
        return any(w.proc.poll() is None and not w.failed and where(w.slice) for w in self.workers)

    def take(self, where: Callable[[Slice], bool] = lambda s: True) -> PooledWorker | None:
        """The pooled worker (on a slice `where` accepts) a cold model gets: an idle one, else
        the one warming longest. The slice stays busy: it is the model's now."""
        live = [
            w for w in self.workers if w.proc.poll() is None and not w.failed and where(w.slice)
        ]
        if not live:
            return None
        w = min(live, key=lambda w: (not w.idle, w.started))
        self.workers.remove(w)
        return w

    async def assign(
        self, w: PooledWorker, argv: list[str], timeout: float, store_checked: str = ""
    ) -> Assigned:
        """Has `w` start the model `medusa run ARGV` would (store_checked: as
        MEDUSA_STORE_CHECKED would say); returns once it serves or failed.
        Stages: wait (for its warm-up, if it was still warming), assign (the gateway's round trip
        beyond the engine's start), weights, restore (or, without an artifact, KV sizing and graph
        capture), ready (taken to serving)."""
        self._assigning += 1
        try:
            return await self._assign(w, argv, timeout, store_checked)
        finally:
            self._assigning -= 1

    async def _assign(
        self, w: PooledWorker, argv: list[str], timeout: float, store_checked: str
    ) -> Assigned:
        t0 = time.monotonic()
        deadline = t0 + timeout
        while not w.idle and w.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if w.failed or w.proc.poll() is not None:
            return Assigned(w.failed or f"it exited ({w.proc.last_error()})", {}, {})
        t1 = time.monotonic()
        try:
            r = await w.client.post(
                "/pool/assign",
                json={"argv": argv, "store_checked": store_checked},
                timeout=max(1.0, deadline - t1),
            )
            body = r.json()
        except (httpx.HTTPError, ValueError) as e:
            return Assigned(f"its assignment got no answer ({type(e).__name__})", {}, {})
        t2 = time.monotonic()
        if r.status_code != 200:
            return Assigned(str(body.get("error", body)), {}, {})
        timings = {k: float(v) for k, v in body.get("timings", {}).items()}
        stages = {
            "wait": t1 - t0,
            "assign": (t2 - t1) - float(body.get("seconds", 0.0)),
            "weights": _sum(timings, "weights"),
            "restore": _sum(timings, "kv_", "graph_", "validate"),
            "ready": t2 - t0,
        }
        return Assigned(None, stages, timings)

    async def shutdown(self) -> None:
        self.closing = True
        workers, self.workers = self.workers, []
        for w in workers:
            w.slice.busy = False
        await asyncio.gather(*(w.proc.reap() for w in workers))
