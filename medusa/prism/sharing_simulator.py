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

import math
from collections.abc import Callable, Sequence

from medusa.errors import PlacementError
from medusa.prism.catalog import DEVICE_MEMORY, Req, SimModel, catalog, trace
from medusa.prism.placement import ModelLoad, place
from medusa.prism.prefill_queue import Misses, PrefillQueue, _Hopeless

POLICIES = ("prism", "muxserve", "static")


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
    misses = Misses((1 - at_least) * len(reqs)) if at_least else Misses(math.inf)
    try:
        return _attainment(policy, models, n, reqs, misses)
    except _Hopeless:
        return 0.0


def _attainment(
    policy: str, models: Sequence[SimModel], n: int, reqs: list[Req], misses: Misses
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
        if on:
            sub = [r for r in reqs if where[r.model] == d]
            _serve_device(policy, models, on, sub, misses)
    return sum(r.ttft <= r.slo for r in reqs) / max(1, len(reqs))


def _serve_device(
    policy: str, models: Sequence[SimModel], on: list[int], sub: list[Req], misses: Misses
) -> None:
    """The requests `sub` of the models `on` one device, under `policy`."""
    kv = 0.9 * DEVICE_MEMORY - sum(models[i].weight_bytes for i in on)
    if policy == "prism":
        PrefillQueue(models, 1.0, _budget(int(kv)), True, "mh", misses).serve(sub)
    elif policy == "muxserve":
        quotas = dict(zip(on, _quotas([models[i] for i in on], kv), strict=True))
        PrefillQueue(models, 1.0, quotas.__getitem__, False, "fcfs", misses).serve(sub)
    else:  # a fixed slice of compute and KV per model, sized by its expected load
        quota, share = _quotas([models[i] for i in on], kv), _shares([models[i] for i in on])
        for i, q, f in zip(on, quota, share, strict=True):
            mine = [r for r in sub if r.model == i]
            PrefillQueue(models, f, _budget(q), False, "fcfs", misses).serve(mine)


def _budget(nbytes: int) -> Callable[[int], int]:
    """The same KV budget for every model."""
    return lambda _model: nbytes


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
