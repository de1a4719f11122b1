"""One worker as the gateway sees it: its slice, address, process and state; and one request's
slot on it (a Lease)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum

from medusa.serve.gateway.slices import Slice
from medusa.serve.gateway.worker_handle import WorkerAddress, WorkerHandle


class State(Enum):
    STARTING = "starting"
    WARM = "warm"
    DRAINING = "draining"
    DEAD = "dead"


@dataclass
class Instance(WorkerAddress):
    model: str
    slice: Slice
    proc: WorkerHandle  # its address: once placed
    state: State = State.STARTING
    inflight: int = 0
    started: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    ready_seconds: float = 0.0
    pooled: bool = False  # started from the warm pool
    stages: dict[str, float] = field(default_factory=dict)  # a pooled start's stages
    timings: dict[str, float] = field(default_factory=dict)  # the engine's, when it sent them
    replaces: Instance | None = None  # a migration: the worker this one retires once it serves


class Lease:
    """One request's slot on `inst`, taken by InstanceManager.acquire (it counts in `inflight`):
    `admit` waits for the request's turn on an elastic slice; `release` gives back everything
    taken so far, once, whatever happened in between (an error, a client that left, a worker
    that died). The caller releases in a `finally`, or hands the lease to what does."""

    def __init__(
        self,
        inst: Instance,
        admit: Callable[[Instance, int], Awaitable[None]],
        done: Callable[[Instance], None],
    ) -> None:
        self.inst, self._admit, self._done = inst, admit, done
        self.admitted = self.released = False

    async def admit(self, prompt_tokens: int) -> None:
        await self._admit(self.inst, prompt_tokens)
        self.admitted = True

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.inst.inflight -= 1
        self.inst.last_used = time.monotonic()
        if self.admitted:
            self._done(self.inst)
