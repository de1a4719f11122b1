"""Workers: started on free slices with the container entrypoint (`medusa run`), health-checked,
routed to least-loaded, scaled up by in-flight load and down after keep_alive."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum

import httpx

from medusa.serve.gateway.config import ModelConfig
from medusa.serve.gateway.slices import Slice

log = logging.getLogger("medusa.gateway")


class State(Enum):
    STARTING = "starting"
    WARM = "warm"
    DRAINING = "draining"
    DEAD = "dead"


@dataclass
class Instance:
    model: str
    slice: Slice
    port: int
    proc: subprocess.Popen[bytes]
    state: State = State.STARTING
    inflight: int = 0
    started: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    ready_seconds: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NoCapacity(Exception):
    pass


class InstanceManager:
    def __init__(
        self,
        models: dict[str, ModelConfig],
        slices: list[Slice],
        *,
        on_cold_start=None,
        startup_timeout: float = 300.0,
    ) -> None:  # type: ignore[no-untyped-def]
        self.models, self.slices = models, slices
        self.instances: dict[str, list[Instance]] = {m: [] for m in models}
        self.waiting: dict[str, int] = {m: 0 for m in models}
        self._changed = asyncio.Condition()
        self._on_cold_start = on_cold_start
        self.startup_timeout = startup_timeout
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- state ----
    def state(self, model: str) -> str:
        insts = [i for i in self.instances[model] if i.state != State.DEAD]
        if any(i.state == State.WARM for i in insts):
            return "warm"
        if any(i.state == State.STARTING for i in insts):
            return "starting"
        if insts:
            return "draining"
        return "cold"

    def free_slice(self) -> Slice | None:
        return next((s for s in self.slices if not s.busy), None)

    # ---- starting and stopping ----
    def start(self, model: str) -> Instance:
        cfg = self.models[model]
        slc = self.free_slice()
        if slc is None:
            raise NoCapacity(f"no free slice for {model}")
        slc.busy = True
        port = _free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MEDUSA_SIM_", "MEDUSA_TRACE", "MEDUSA_MODE"))
        }
        env.update(slc.env)
        cmd = [
            sys.executable,
            "-m",
            "medusa.cli",
            "run",
            *cfg.worker_args(),
            "--port",
            str(port),
            "--served-model-name",
            model,
        ]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        inst = Instance(model, slc, port, proc)
        self.instances[model].append(inst)
        log.info("starting %s on slice %s (pid %d, port %d)", model, slc.id, proc.pid, port)
        task = asyncio.get_running_loop().create_task(self._wait_ready(inst))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return inst

    async def _wait_ready(self, inst: Instance) -> None:
        deadline = time.monotonic() + self.startup_timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline and inst.proc.poll() is None:
                try:
                    r = await client.get(f"{inst.url}/health")
                    if r.status_code == 200:
                        break
                    if r.status_code == 500:
                        log.error("%s failed to start: %s", inst.model, r.text)
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            else:
                r = None
        ok = inst.proc.poll() is None and r is not None and r.status_code == 200
        if ok:
            inst.state = State.WARM
            inst.ready_seconds = time.monotonic() - inst.started
            inst.last_used = time.monotonic()
            log.info("%s ready on %s in %.2f s", inst.model, inst.slice.id, inst.ready_seconds)
            if self._on_cold_start:
                await self._on_cold_start(inst)
        else:
            self._retire(inst)
        async with self._changed:
            self._changed.notify_all()

    def _retire(self, inst: Instance) -> None:
        if inst.state == State.DEAD:
            return
        inst.state = State.DEAD
        if inst.proc.poll() is None:
            inst.proc.terminate()
        inst.slice.busy = False
        if inst in self.instances[inst.model]:
            self.instances[inst.model].remove(inst)

    async def stop(self, inst: Instance, *, drain_timeout: float = 30.0) -> None:
        inst.state = State.DRAINING
        deadline = time.monotonic() + drain_timeout
        while inst.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._retire(inst)
        try:
            inst.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            inst.proc.kill()
        async with self._changed:
            self._changed.notify_all()

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
            if self.free_slice() is not None:
                self.start(model)

    async def acquire(self, model: str, timeout: float) -> Instance:
        """The least-loaded warm instance, starting one if needed; waits while it starts."""
        cfg = self.models[model]
        if self.waiting[model] >= cfg.max_queue and not self._warm(model):
            raise QueueFull(model)
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
                    return inst
                if not [i for i in self.instances[model] if i.state == State.STARTING]:
                    self._maybe_scale_up(model)
                    if not self.instances[model]:
                        raise NoCapacity(f"no free slice to start {model} on")
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

    def release(self, inst: Instance) -> None:
        inst.inflight -= 1
        inst.last_used = time.monotonic()

    # ---- the autoscaler ----
    async def autoscale(self, period: float = 0.25) -> None:
        while True:
            now = time.monotonic()
            for model, cfg in self.models.items():
                warm = self._warm(model)
                active = len([i for i in self.instances[model] if i.state != State.DEAD])
                for inst in warm:
                    idle = now - inst.last_used
                    if inst.inflight == 0 and idle > cfg.keep_alive and active > cfg.min_instances:
                        log.info("scaling %s down (idle %.1f s)", model, idle)
                        active -= 1
                        await self.stop(inst)
                starting_or_warm = [
                    i for i in self.instances[model] if i.state in (State.WARM, State.STARTING)
                ]
                while len(starting_or_warm) < cfg.min_instances and self.free_slice():
                    starting_or_warm.append(self.start(model))
            await asyncio.sleep(period)

    async def shutdown(self) -> None:
        await asyncio.gather(
            *(self.stop(i) for insts in self.instances.values() for i in list(insts))
        )


class QueueFull(Exception):
    pass
