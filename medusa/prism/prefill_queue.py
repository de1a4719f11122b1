"""One simulated device's prefill server (medusa.prism.sharing_simulator): a request's prefill
takes prompt tokens / the model's prefill speed, and the request holds KV for its prompt and
output from the start of its prefill until its last token (output tokens x the model's TPOT). A
request whose KV does not fit waits; one that waited `ABANDON` seconds leaves and counts as a
miss."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from medusa.prism.catalog import Req, SimModel
from medusa.prism.schedule import Job, moore_hodgson

ABANDON = 30.0
WINDOW = 128  # the oldest waiting requests a dispatch looks at (keeps overload runs fast)


class _Hopeless(Exception):  # NOTE: package-private (medusa.prism.sharing_simulator catches it)
    """More requests missed than the attainment asked for allows: no need to go on."""


class Misses:
    def __init__(self, allowed: float) -> None:
        self.allowed, self.count = allowed, 0

    def add(self, n: int = 1) -> None:
        self.count += n
        if self.count > self.allowed:
            raise _Hopeless


class PrefillQueue:
    """One prefill server at `speed` x a whole device. kv_budget(model) -> bytes: the device's
    pool (pooled) or the model's own quota. order: "fcfs" (the earliest arrival that fits) or
    "mh" (Moore-Hodgson)."""

    def __init__(
        self,
        models: Sequence[SimModel],
        speed: float,
        kv_budget: Callable[[int], int],
        pooled: bool,
        order: str,
        misses: Misses,
    ) -> None:
        self.models, self.speed, self.kv_budget = models, speed, kv_budget
        self.pooled, self.order, self.misses = pooled, order, misses
        self.used: dict[int, int] = {}
        self.releases: list[tuple[float, int, int]] = []  # (time, pool key, bytes)
        self.live: list[Req] = []  # arrived, waiting, in arrival order
        self.deadlines: list[tuple[float, int, Req]] = []  # of live requests, to count misses
        self.now = 0.0

    def serve(self, reqs: list[Req]) -> None:
        """Serves `reqs` (arrival order); fills in each request's ttft."""
        i = 0
        while i < len(reqs) or self.live:
            i = self._advance(reqs, i)
            cand = [r for r in self.live[:WINDOW] if self._fits(r)]
            pick = _pick(cand, self.models, self.now, self.order, self.speed)
            if pick is not None:
                self._prefill(pick)
                continue
            nxt = [reqs[i].arrival] if i < len(reqs) else []
            nxt += [self.releases[0][0]] if self.releases else []
            if not nxt:
                self.misses.add(sum(not r.doomed for r in self.live))  # can never fit: abandoned
                return
            self.now = max(self.now, min(nxt))

    def _advance(self, reqs: list[Req], i: int) -> int:
        """Up to now: KV given back, requests arrived (from reqs[i]), deadlines passed. Returns
        the next request not arrived yet."""
        now = self.now
        while self.releases and self.releases[0][0] <= now:
            _, key, nbytes = heapq.heappop(self.releases)
            self.used[key] -= nbytes
        while i < len(reqs) and reqs[i].arrival <= now:
            self.live.append(reqs[i])
            heapq.heappush(self.deadlines, (reqs[i].arrival + reqs[i].slo, i, reqs[i]))
            i += 1
        while self.deadlines and self.deadlines[0][0] < now:
            r = heapq.heappop(self.deadlines)[2]
            if r.ttft == math.inf:  # still waiting: it cannot make it any more
                r.doomed = True
                self.misses.add()
        if self.live and now - self.live[0].arrival > ABANDON:
            self.live = [r for r in self.live if now - r.arrival <= ABANDON]  # all doomed already
        return i

    def _need(self, r: Req) -> int:
        return (r.prompt + r.output) * self.models[r.model].kv_per_token

    def _key(self, r: Req) -> int:
        return -1 if self.pooled else r.model

    def _fits(self, r: Req) -> bool:
        return self.used.get(self._key(r), 0) + self._need(r) <= self.kv_budget(r.model)

    def _prefill(self, pick: Req) -> None:
        self.live.remove(pick)
        m, key = self.models[pick.model], self._key(pick)
        self.used[key] = self.used.get(key, 0) + self._need(pick)
        end = self.now + pick.prompt / (m.prefill_tps * self.speed)
        pick.ttft = end - pick.arrival
        if pick.ttft > pick.slo and not pick.doomed:
            self.misses.add()
        heapq.heappush(self.releases, (end + pick.output * m.tpot, key, self._need(pick)))
        self.now = end


def _pick(
    cand: list[Req], models: Sequence[SimModel], now: float, order: str, speed: float
) -> Req | None:
    if not cand:
        return None
    if order == "fcfs":
        return cand[0]
    jobs = [
        Job(r.arrival + r.slo, r.prompt / (models[r.model].prefill_tps * speed), r) for r in cand
    ]
    on_time, late = moore_hodgson(jobs, now)
    return (on_time or late)[0].key  # type: ignore[return-value]
