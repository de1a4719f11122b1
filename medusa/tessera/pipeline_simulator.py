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
    nk = p.times.shape[0]
    preds: dict[int, list[tuple[int, float]]] = defaultdict(list)
    succs: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for u, v, b in p.edges:
        preds[v].append((u, b))
        succs[u].append((v, b))
    waiting = {(r, k): len(preds[k]) for r in range(requests) for k in range(nk)}
    ready_at: dict[tuple[int, int], float] = defaultdict(float)
    queue: list[list[tuple[int, int]]] = [[] for _ in p.devices]  # heaps of (request, kernel)
    dev_free = [0.0] * len(p.devices)
    link_free: dict[tuple[int, int], float] = defaultdict(float)
    events: list[tuple[float, int, int]] = []  # (time, request, kernel) a kernel becomes ready
    done_count = [0] * requests
    finish = [0.0] * requests

    def release(r: int, at: float) -> None:
        for k in range(nk):
            if not preds[k]:
                heapq.heappush(events, (at, r, k))

    for r in range(min(window, requests)):
        release(r, 0.0)
    started = min(window, requests)
    now = 0.0
    while events or any(queue):
        while events and events[0][0] <= now:
            t, r, k = heapq.heappop(events)
            ready_at[(r, k)] = t
            heapq.heappush(queue[placement[k]], (r, k))
        progressed = False
        for d, q in enumerate(queue):
            if q and dev_free[d] <= now:
                r, k = heapq.heappop(q)
                end = now + float(p.times[k, d])
                dev_free[d] = end
                progressed = True
                for v, b in succs[k]:
                    arrive = end
                    if placement[v] != d:
                        lk = (d, placement[v])
                        start = max(end, link_free[lk])
                        link_free[lk] = start + b / p.link.bandwidth
                        arrive = link_free[lk] + p.link.latency
                    ready_at[(r, v)] = max(ready_at[(r, v)], arrive)
                    waiting[(r, v)] -= 1
                    if waiting[(r, v)] == 0:
                        heapq.heappush(events, (ready_at[(r, v)], r, v))
                done_count[r] += 1
                if done_count[r] == nk:
                    finish[r] = end
                    if started < requests:
                        release(started, end)
                        started += 1
        if not progressed:
            nxt = [t for t in dev_free if t > now] + ([events[0][0]] if events else [])
            if not nxt:
                break
            now = min(nxt)
    warm = requests // 4  # skip the pipeline's fill
    span = max(finish) - sorted(finish)[warm]
    return (requests - 1 - warm) / span if span > 0 else float("inf")
