"""Sharing devices among a long-tailed catalog of models, simulated: Prism (KV-pressure placement,
one elastic KV pool per device, Moore-Hodgson queue) against static partitioning (each model a
fixed slice of a device's memory and compute) and a MuxServe-like policy (static placement and
fixed KV quotas, compute shared first come first served).

Each device is simulated on its own after placement: one prefill server (a request's prefill takes
prompt tokens / the model's prefill speed), and a request holds KV for its prompt and output from
the start of its prefill until its last token (output tokens x the model's TPOT). A request whose
KV does not fit waits; one that waited `ABANDON` seconds leaves and counts as a miss. TTFT is the
end of prefill minus arrival; attainment is the share of requests with TTFT within their SLO."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from medusa.errors import PlacementError
from medusa.prism.placement import ModelLoad, place
from medusa.prism.schedule import Job, moore_hodgson

GiB = 2**30
DEVICE_MEMORY = 80 * GiB  # an H100
FLOPS = 4e14  # sustained prefill FLOP/s of one device (about 40% of an H100's dense bf16)
HBM = 2.0e12  # bytes/s a decode step streams weights at
ABANDON = 30.0
WINDOW = 128  # the oldest waiting requests a dispatch looks at (keeps overload runs fast)
SIZES = (1.0, 3.0, 7.0, 8.0, 13.0)  # billions of parameters, as in long-tail catalogs
POLICIES = ("prism", "muxserve", "static")


@dataclass(frozen=True)
class SimModel:
    name: str
    params: float  # billions
    rate: float  # requests/s at load 1
    slo: float  # TTFT SLO, seconds

    @property
    def weight_bytes(self) -> int:
        return int(self.params * 1e9 * 2)  # bf16

    @property
    def prefill_tps(self) -> float:
        return FLOPS / (2 * self.params * 1e9)

    @property
    def tpot(self) -> float:
        return self.weight_bytes / HBM

    @property
    def kv_per_token(self) -> int:  # K and V, bf16, GQA with 8 KV heads of 128 over its layers
        layers = {1.0: 16, 3.0: 28, 7.0: 32, 8.0: 32, 13.0: 40}.get(self.params, 32)
        return 2 * layers * 8 * 128 * 2


@dataclass
class Req:
    arrival: float
    model: int
    prompt: int
    output: int
    slo: float  # seconds: the model's SLO, scaled up for prompts longer than 1024 tokens
    ttft: float = math.inf
    doomed: bool = False  # counted as a miss already (its deadline passed while it waited)


def catalog(n: int, total_rate: float, seed: int = 0, zipf: float = 1.1) -> list[SimModel]:
    """n models with Zipf popularity (rank r gets a share r^-zipf of `total_rate`), sizes drawn
    from SIZES, TTFT SLOs of 10x an idle device's prefill of a 1024-token prompt (>= 0.5 s; a
    longer prompt's SLO grows with it)."""
    rng = random.Random(seed)
    shares = [(r + 1) ** -zipf for r in range(n)]
    out = []
    for i in range(n):
        p = rng.choice(SIZES)
        slo = max(0.5, 10 * 1024 * 2 * p * 1e9 / FLOPS)
        out.append(SimModel(f"m{i:02d}-{p:g}b", p, total_rate * shares[i] / sum(shares), slo))
    return out


def trace(models: Sequence[SimModel], load: float, duration: float, seed: int, cv: float = 2.0):
    """Requests of every model over `duration` s at `load` x their rates: gamma interarrivals
    with coefficient of variation `cv` (bursts), lognormal prompt and output lengths."""
    rng = random.Random(seed)
    reqs = []
    shape = 1 / cv**2
    for i, m in enumerate(models):
        rate = m.rate * load
        t = rng.gammavariate(shape, 1 / (rate * shape))
        while t < duration:
            prompt = min(4096, max(16, int(rng.lognormvariate(math.log(600), 0.8))))
            output = min(1024, max(1, int(rng.lognormvariate(math.log(150), 0.8))))
            reqs.append(Req(t, i, prompt, output, m.slo * max(1.0, prompt / 1024)))
            t += rng.gammavariate(shape, 1 / (rate * shape))
    reqs.sort(key=lambda r: r.arrival)
    return reqs


class _Hopeless(Exception):
    """More requests missed than the attainment asked for allows: no need to go on."""


@dataclass
class _Misses:
    allowed: float
    count: int = 0

    def add(self, n: int = 1) -> None:
        self.count += n
        if self.count > self.allowed:
            raise _Hopeless


def _serve(
    reqs: list[Req],
    models: Sequence[SimModel],
    speed: float,
    kv_budget: Callable[[int], int],
    pooled: bool,
    order: str,
    misses: _Misses,
) -> None:
    """One prefill server at `speed` x a whole device over `reqs` (arrival order); fills in each
    request's ttft. kv_budget(model) -> bytes: the device's pool (pooled) or the model's own
    quota. order: "fcfs" (the earliest arrival that fits) or "mh" (Moore-Hodgson)."""
    used: dict[int, int] = {}
    releases: list[tuple[float, int, int]] = []  # (time, pool key, bytes)
    live: list[Req] = []  # arrived, waiting, in arrival order
    deadlines: list[tuple[float, int, Req]] = []  # of live requests, to count misses early
    i, now = 0, 0.0

    def need(r: Req) -> int:
        return (r.prompt + r.output) * models[r.model].kv_per_token

    def fits(r: Req) -> bool:
        return used.get(-1 if pooled else r.model, 0) + need(r) <= kv_budget(r.model)

    while i < len(reqs) or live:
        while releases and releases[0][0] <= now:
            _, key, nbytes = heapq.heappop(releases)
            used[key] -= nbytes
        while i < len(reqs) and reqs[i].arrival <= now:
            live.append(reqs[i])
            heapq.heappush(deadlines, (reqs[i].arrival + reqs[i].slo, i, reqs[i]))
            i += 1
        while deadlines and deadlines[0][0] < now:
            r = heapq.heappop(deadlines)[2]
            if r.ttft == math.inf:  # still waiting: it cannot make it any more
                r.doomed = True
                misses.add()
        if live and now - live[0].arrival > ABANDON:
            live = [r for r in live if now - r.arrival <= ABANDON]  # all doomed already
        pick = _pick([r for r in live[:WINDOW] if fits(r)], models, now, order, speed)
        if pick is None:
            nxt = [reqs[i].arrival] if i < len(reqs) else []
            nxt += [releases[0][0]] if releases else []
            if not nxt:
                misses.add(sum(not r.doomed for r in live))  # can never fit: abandoned
                break
            now = max(now, min(nxt))
            continue
        live.remove(pick)
        m = models[pick.model]
        key = -1 if pooled else pick.model
        used[key] = used.get(key, 0) + need(pick)
        end = now + pick.prompt / (m.prefill_tps * speed)
        pick.ttft = end - pick.arrival
        if pick.ttft > pick.slo and not pick.doomed:
            misses.add()
        heapq.heappush(releases, (end + pick.output * m.tpot, key, need(pick)))
        now = end


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


def _balanced(models: Sequence[SimModel], n: int) -> list[int]:
    """Static placement (static and MuxServe-like): by decreasing size, onto the device with the
    most memory left, so every device keeps a like share of KV room; rates are not looked at."""
    room = [0.9 * DEVICE_MEMORY] * n
    where = [0] * len(models)
    for i in sorted(range(len(models)), key=lambda i: (-models[i].weight_bytes, i)):
        d = max(range(n), key=lambda d: (room[d], -d))
        if room[d] < models[i].weight_bytes + _max_request(models[i]):
            raise PlacementError(f"{models[i].name} fits on none of {n} devices")
        where[i], room[d] = d, room[d] - models[i].weight_bytes
    return where


def _max_request(m: SimModel) -> int:
    return (4096 + 1024) * m.kv_per_token


def attainment(
    policy: str, models: Sequence[SimModel], n: int, reqs: list[Req], at_least: float = 0.0
) -> float:
    """The share of `reqs` whose TTFT meets their SLO under `policy` on n devices; 0.0 as soon as
    it is sure to be below `at_least`."""
    misses = _Misses((1 - at_least) * len(reqs)) if at_least else _Misses(math.inf)
    try:
        return _attainment(policy, models, n, reqs, misses)
    except _Hopeless:
        return 0.0


def _attainment(
    policy: str, models: Sequence[SimModel], n: int, reqs: list[Req], misses: _Misses
) -> float:
    if policy == "prism":
        loads = [ModelLoad(m.name, m.weight_bytes, m.rate, m.slo, _max_request(m)) for m in models]
        by_name = place(loads, [int(0.9 * DEVICE_MEMORY)] * n)
        where = [by_name[m.name] for m in models]
    else:
        where = _balanced(models, n)
    for r in reqs:
        r.ttft, r.doomed = math.inf, False
    for d in range(n):
        on = [i for i in range(len(models)) if where[i] == d]
        if not on:
            continue
        kv = 0.9 * DEVICE_MEMORY - sum(models[i].weight_bytes for i in on)
        sub = [r for r in reqs if where[r.model] == d]
        if policy == "prism":
            _serve(sub, models, 1.0, lambda _m, kv=kv: int(kv), True, "mh", misses)
        elif policy == "muxserve":
            quota = _quotas([models[i] for i in on], kv)
            q = dict(zip(on, quota, strict=True))
            _serve(sub, models, 1.0, lambda m, q=q: q[m], False, "fcfs", misses)
        else:  # a fixed slice of compute and KV per model, sized by its expected load
            quota, share = _quotas([models[i] for i in on], kv), _shares([models[i] for i in on])
            for i, q, f in zip(on, quota, share, strict=True):
                mine = [r for r in sub if r.model == i]
                _serve(mine, models, f, lambda _m, q=q: q, False, "fcfs", misses)
    return sum(r.ttft <= r.slo for r in reqs) / max(1, len(reqs))


def _quotas(on: Sequence[SimModel], kv: float) -> list[int]:
    """Fixed KV quotas in proportion to rate, each at least one largest request."""
    floor = [_max_request(m) for m in on]
    spare = max(0.0, kv - sum(floor))
    total = sum(m.rate for m in on) or 1.0
    return [int(f + spare * m.rate / total) for f, m in zip(floor, on, strict=True)]


def _shares(on: Sequence[SimModel]) -> list[float]:
    """Compute shares: each model first what serves a 1024-token prompt alone in a third of its
    SLO, then the rest in proportion to rate (MIG-like slices sized by expected load)."""
    floor = [min(1.0, 3 * 1024 / (m.prefill_tps * m.slo)) for m in on]
    if sum(floor) >= 1:
        return [f / sum(floor) for f in floor]
    total = sum(m.rate for m in on) or 1.0
    return [f + (1 - sum(floor)) * m.rate / total for f, m in zip(floor, on, strict=True)]


def max_load(
    policy: str,
    models: Sequence[SimModel],
    n: int,
    duration: float,
    seed: int,
    target: float = 0.99,
    steps: int = 9,
) -> float:
    """The largest load multiplier at which `policy` keeps `target` attainment (bisection on a
    log scale; 0 when even a light load misses)."""

    def ok(load: float) -> bool:
        try:
            reqs = trace(models, load, duration, seed)
            return attainment(policy, models, n, reqs, target) >= target
        except PlacementError:
            return False

    lo, hi = 0.0, 1.0
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > 1024:
            return lo
    if lo == 0.0:
        lo = hi / 64
        if not ok(lo):
            return 0.0
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def devices_needed(
    policy: str, models: Sequence[SimModel], load: float, duration: float, seed: int, most: int
) -> int | None:
    """The fewest devices (up to `most`) on which `policy` keeps 99% attainment at `load`."""
    reqs = trace(models, load, duration, seed)
    for n in range(1, most + 1):
        try:
            if attainment(policy, models, n, reqs, 0.99) >= 0.99:
                return n
        except PlacementError:
            continue
    return None


def compare(
    n_models: int = 16,
    n_devices: int = 8,
    duration: float = 120.0,
    seed: int = 0,
    total_rate: float = 20.0,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, dict[str, float | int | None]]:
    """Per policy: the largest load (requests/s over the whole catalog) each sustains at 99%
    TTFT attainment on n_devices, and the devices each needs for the load the MuxServe-like
    policy sustains there."""
    models = catalog(n_models, total_rate, seed)
    out: dict[str, dict[str, float | int | None]] = {}
    for policy in POLICIES:
        progress(f"max load of {policy}")
        out[policy] = {"max_rps": total_rate * max_load(policy, models, n_devices, duration, seed)}
    ref = (out["muxserve"]["max_rps"] or 0.0) / total_rate
    for policy in POLICIES:
        progress(f"devices {policy} needs")
        out[policy]["devices"] = (
            devices_needed(policy, models, ref, duration, seed, 2 * n_devices) if ref else None
        )
    return out
