"""One worker as the gateway sees it: its slice, address, process and state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from medusa.serve.gateway.backends import WorkerHandle
from medusa.serve.gateway.slices import Slice
from medusa.serve.gateway.worker_process import WorkerAddress


class State(Enum):
    STARTING = "starting"
    WARM = "warm"
    DRAINING = "draining"
    DEAD = "dead"


@dataclass
class Instance(WorkerAddress):
    model: str
    slice: Slice
    port: int
    proc: WorkerHandle
    token: str
    state: State = State.STARTING
    inflight: int = 0
    started: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    ready_seconds: float = 0.0
    pooled: bool = False  # started from the warm pool
    stages: dict[str, float] = field(default_factory=dict)  # a pooled start's stages
    timings: dict[str, float] = field(default_factory=dict)  # the engine's, when it sent them
    replaces: Instance | None = None  # a migration: the worker this one retires once it serves
