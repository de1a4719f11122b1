"""Prism's local scheduling (its Alg. 2): one queue per device across the models on it, ordered so
that as few requests as possible miss their deadline (arrival + TTFT SLO). Moore-Hodgson gives
that minimum on one machine when the jobs' lengths are known; the length of a request is its
prefill, estimated as prompt length / prefill speed."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Job:
    deadline: float  # absolute: arrival + the model's TTFT SLO
    length: float  # estimated seconds of device time (prompt tokens / prefill speed)
    key: object = field(default=None, compare=False)


def moore_hodgson(jobs: Sequence[Job], start: float = 0.0) -> tuple[list[Job], list[Job]]:
    """(on time, late): the on-time jobs in deadline order, then the late ones, also by deadline.

    Running the first list from `start` meets every deadline in it, and no order of `jobs` meets
    more. Adds jobs by deadline; whenever the last one added would finish late, drops the longest
    job taken so far (it frees the most time while costing one miss, whichever job it is)."""
    taken: list[tuple[float, int, Job]] = []  # max-heap on length (negated), ties by order
    end = start
    late: list[Job] = []
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].deadline, i))
    for i in order:
        job = jobs[i]
        heapq.heappush(taken, (-job.length, i, job))
        end += job.length
        if end > job.deadline:
            neg, _, longest = heapq.heappop(taken)
            end += neg
            late.append(longest)
    on_time = sorted((j for _, _, j in taken), key=lambda j: j.deadline)
    return on_time, sorted(late, key=lambda j: j.deadline)


def misses(order: Sequence[Job], start: float = 0.0) -> int:
    """How many jobs of `order`, run back to back from `start`, end after their deadline."""
    end, n = start, 0
    for job in order:
        end += job.length
        n += end > job.deadline
    return n


class DeviceQueue:
    """The waiting requests of every model on one device, served in Moore-Hodgson order."""

    def __init__(self, prefill_speed: float) -> None:
        if prefill_speed <= 0:
            raise ValueError(f"prefill_speed must be > 0 tokens/s, got {prefill_speed}")
        self.prefill_speed = prefill_speed
        self._jobs: list[Job] = []

    def __len__(self) -> int:
        return len(self._jobs)

    def push(self, key: object, arrival: float, slo_ttft: float, prompt_tokens: int) -> None:
        self._jobs.append(Job(arrival + slo_ttft, prompt_tokens / self.prefill_speed, key))

    def discard(self, key: object) -> None:
        """Forgets the waiting request `key` (its client left); nothing if it is not queued."""
        self._jobs = [j for j in self._jobs if j.key != key]

    def pop(self, now: float) -> object:
        """The request to start now: the first on-time one, or (none can still make it) the
        earliest deadline among the late ones."""
        if not self._jobs:
            raise IndexError("pop from an empty DeviceQueue")
        on_time, late = moore_hodgson(self._jobs, now)
        job = on_time[0] if on_time else late[0]
        self._jobs.remove(job)
        return job.key
