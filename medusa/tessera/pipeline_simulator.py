"""Pipelined execution of a placement, simulated: requests run the kernels in order, each device
runs one kernel at a time (earlier requests first, as Tessera's per-request stream priorities do),
a cut edge's bytes cross the link (serialized per direction) and arrive after its latency. With a
window of one request in flight the devices take turns; a wider window fills the pipeline."""

from __future__ import annotations

import heapq
from collections import defaultdict

from medusa.tessera.planner import Problem


def simulate(p: Problem, placement: list[int], requests: int, window: int) -> float:
    """Steady throughput (requests per second) over `requests` requests, `window` in flight."""
    if window < 1 or requests < 1:
        raise ValueError("requests and window must be at least 1")
    sim = _Pipeline(p, placement, requests)
    for r in range(min(window, requests)):
        sim.release(r, 0.0)
    sim.started = min(window, requests)
    now = 0.0
    while sim.events or any(sim.queue):
        sim.enqueue_ready(now)
        progressed = False
        for d, q in enumerate(sim.queue):
            if q and sim.dev_free[d] <= now:
                sim.run_next(d, now)
                progressed = True
        if not progressed:
            nxt = [t for t in sim.dev_free if t > now] + ([sim.events[0][0]] if sim.events else [])
            if not nxt:
                break
            now = min(nxt)
    warm = requests // 4  # skip the pipeline's fill
    span = max(sim.finish) - sorted(sim.finish)[warm]
    return (requests - 1 - warm) / span if span > 0 else float("inf")


class _Pipeline:
    """What each (request, kernel) waits for, each device's queue, and when each device and each
    link direction is next free."""

    def __init__(self, p: Problem, placement: list[int], requests: int) -> None:
        self.p, self.placement = p, placement
        self.nk = nk = p.times.shape[0]
        self.preds: dict[int, list[tuple[int, float]]] = defaultdict(list)
        self.succs: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for u, v, b in p.edges:
            self.preds[v].append((u, b))
            self.succs[u].append((v, b))
        self.waiting = {(r, k): len(self.preds[k]) for r in range(requests) for k in range(nk)}
        self.ready_at: dict[tuple[int, int], float] = defaultdict(float)
        self.queue: list[list[tuple[int, int]]] = [[] for _ in p.devices]  # heaps (request, kernel)
        self.dev_free = [0.0] * len(p.devices)
        self.link_free: dict[tuple[int, int], float] = defaultdict(float)
        self.events: list[tuple[float, int, int]] = []  # (time, request, kernel) becomes ready
        self.done_count = [0] * requests
        self.finish = [0.0] * requests
        self.requests, self.started = requests, 0

    def release(self, r: int, at: float) -> None:
        """Request r enters at `at`: its kernels without predecessors become ready."""
        for k in range(self.nk):
            if not self.preds[k]:
                heapq.heappush(self.events, (at, r, k))

    def enqueue_ready(self, now: float) -> None:
        """Kernels ready by `now` join their device's queue."""
        while self.events and self.events[0][0] <= now:
            t, r, k = heapq.heappop(self.events)
            self.ready_at[(r, k)] = t
            heapq.heappush(self.queue[self.placement[k]], (r, k))

    def run_next(self, d: int, now: float) -> None:
        """Device d runs its earliest request's kernel; a finished request lets the next one in."""
        r, k = heapq.heappop(self.queue[d])
        end = now + float(self.p.times[k, d])
        self.dev_free[d] = end
        self._send(r, k, d, end)
        self.done_count[r] += 1
        if self.done_count[r] == self.nk:
            self.finish[r] = end
            if self.started < self.requests:
                self.release(self.started, end)
                self.started += 1

    def _send(self, r: int, k: int, d: int, end: float) -> None:
        """Kernel k's outputs reach its consumers, across the link where they run elsewhere."""
        for v, b in self.succs[k]:
            arrive = end
            if self.placement[v] != d:
                lk = (d, self.placement[v])
                start = max(end, self.link_free[lk])
                self.link_free[lk] = start + b / self.p.link.bandwidth
                arrive = self.link_free[lk] + self.p.link.latency
            self.ready_at[(r, v)] = max(self.ready_at[(r, v)], arrive)
            self.waiting[(r, v)] -= 1
            if self.waiting[(r, v)] == 0:
                heapq.heappush(self.events, (self.ready_at[(r, v)], r, v))
