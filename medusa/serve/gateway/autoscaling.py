"""When the gateway starts and stops a model's workers, decided from what it observes: plain
numbers in, a decision out; no I/O, no clock (the caller says how long each worker has been idle).
The instance manager (medusa.serve.gateway.instances) observes and acts; this decides.

- A request may start another worker when the model has fewer than `max_instances` warm or
  starting, and none, or more load (requests in flight on them plus waiting) than `target` each.
- A request is refused once what waits beyond `target` per warm worker reaches `max_queue`.
- A warm worker with nothing in flight and idle past `keep_alive` stops while more than
  `min_instances` are live; one on an elastic slice stays (it holds only its weights there, and
  placement evicts it for a model that needs the room).
- Workers start until `min_instances` are warm or starting."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from medusa.serve.gateway.config import ModelConfig


@dataclass(frozen=True)
class WorkerLoad:
    """One warm worker, as the autoscaler sees it."""

    inflight: int  # requests it is answering
    idle_seconds: float  # since its last request ended
    elastic: bool = False  # on an elastic (shared) slice


def wants_another(cfg: ModelConfig, num_active: int, load: int) -> bool:
    """Whether a request should start one more worker: `num_active` warm or starting, `load`
    requests in flight on them plus waiting."""
    return num_active < cfg.max_instances and (num_active == 0 or load > cfg.target * num_active)


def queue_full(cfg: ModelConfig, num_warm: int, inflight: int, waiting: int) -> bool:
    """Whether a request is refused: requests beyond `target` per warm worker wait in the worker,
    and count as queued with those waiting for one."""
    return waiting + inflight - cfg.target * num_warm >= cfg.max_queue


def to_stop(cfg: ModelConfig, warm: Sequence[WorkerLoad], num_live: int) -> list[int]:
    """The warm workers to stop (their indices in `warm`, in order), `num_live` being the model's
    workers that are not dead (starting and draining ones count)."""
    out = []
    for i, w in enumerate(warm):
        if w.elastic:
            continue
        if w.inflight == 0 and w.idle_seconds > cfg.keep_alive and num_live > cfg.min_instances:
            out.append(i)
            num_live -= 1
    return out


def shortfall(cfg: ModelConfig, num_active: int) -> int:
    """Workers to start so that `min_instances` are warm or starting."""
    return max(0, cfg.min_instances - num_active)
