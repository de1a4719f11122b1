"""A discrete-time simulation of several models served on one superchip's MIG slices, each
streaming its weights over the shared C2C link, driven by the performance model. Policies can be
switched one at a time: placement (random vs bandwidth-aware), prefill chunk (default vs tuned),
alpha (static vs tuned by the controller)."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from medusa.c2c.controller import AlphaController
from medusa.c2c.model import C2C_BW, SliceProfile, gemm_traffic
from medusa.c2c.scheduler import (
    GPU_TILES,
    ModelShape,
    admit,
    prefill_chunk,
    profile_table,
    random_placement,
)

DEFAULT_CHUNK = 256  # a latency-oriented chunked-prefill default
BURST = 8
STATIC_ALPHA = 1.0  # "static": a plain output-stationary GEMM, what a GPU library would run


@dataclass(frozen=True)
class Policy:
    placement: str = "bandwidth"  # or "random"
    chunk: str = "tuned"  # or "default"
    alpha: str = "tuned"  # or "static"


@dataclass
class Request:
    arrival: float
    model: str
    prompt: int
    output: int
    prefilled: int = 0
    generated: int = 0
    first_token: float | None = None
    done: float | None = None


@dataclass
class Instance:
    model: ModelShape
    slice: SliceProfile
    chunk: int
    controller: AlphaController
    tune_alpha: bool
    queue: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)
    step: tuple[str, list[Request], float, float, float] | None = (
        None  # kind, reqs, c2c, hbm, flops
    )
    done_frac: float = 0.0
    window: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # c2c, hbm bytes, busy s
    last_tpot: float = 0.0


def _step_work(inst: Instance, tokens: int) -> tuple[float, float, float]:
    m = inst.model
    c2c = hbm = flops = 0.0
    for n, k in m.gemms:
        t = gemm_traffic(tokens, n, k, inst.controller.alpha, GPU_TILES, m.elem)
        c2c += t.c2c_read * m.layers
        hbm += t.hbm * m.layers
        flops += t.flops * m.layers
    return c2c, hbm, flops


def _next_step(inst: Instance, now: float) -> None:
    if inst.queue:
        r = inst.queue[0]
        tokens = min(inst.chunk, r.prompt - r.prefilled)
        inst.step = ("prefill", [r], *_step_work(inst, tokens))
        r.prefilled += tokens
        if r.prefilled >= r.prompt:
            inst.queue.popleft()
            inst.running.append(r)
    elif inst.running:
        inst.step = ("decode", list(inst.running), *_step_work(inst, len(inst.running)))
    inst.done_frac = 0.0


def _finish_step(inst: Instance, now: float) -> None:
    kind, reqs, *_ = inst.step  # type: ignore[misc]
    for r in reqs:
        if kind == "prefill" and r.prefilled >= r.prompt and r.first_token is None:
            r.first_token = now
            r.generated = 1
        elif kind == "decode":
            r.generated += 1
        if r.generated >= r.output and r in inst.running:
            r.done = now
            inst.running.remove(r)
    inst.step = None


def _alone(i: Instance) -> float:
    """The step's duration with the link to itself: its roofline on its slice."""
    _, _, c2c, hbm, flops = i.step  # type: ignore[misc]
    return max(c2c / C2C_BW, hbm / i.slice.hbm_bw, flops / i.slice.flops, 1e-9)


def simulate(
    models: list[ModelShape],
    slices: list[SliceProfile],
    requests: list[Request],
    policy: Policy,
    *,
    dt: float = 0.002,
    interval: float = 0.1,
    seed: int = 0,
    horizon: float | None = None,
) -> dict:
    insts = _instances(models, slices, requests, policy, seed)
    share = C2C_BW / len(models)
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    end = horizon or (max(r.arrival for r in requests) + 120.0)
    now, next_tune, util = 0.0, interval, []
    c2c_tick = 0.0
    while now < end and (pending or any(i.queue or i.running or i.step for i in insts.values())):
        while pending and pending[0].arrival <= now:
            r = pending.popleft()
            insts[r.model].queue.append(r)
        for inst in insts.values():
            if inst.step is None:
                _next_step(inst, now)
        for moved in _advance(insts, now, dt):
            c2c_tick += moved
        now += dt
        if now >= next_tune:
            util.append((round(now, 3), c2c_tick / (C2C_BW * interval)))
            c2c_tick = 0.0
            _tune(insts, share)
            next_tune += interval
    return _report(requests, models, insts, util)


def _instances(
    models: list[ModelShape],
    slices: list[SliceProfile],
    requests: list[Request],
    policy: Policy,
    seed: int,
) -> dict[str, Instance]:
    """Each model placed on a slice, with its prefill chunk and alpha controller."""
    placed = (
        admit(models, slices)
        if policy.placement == "bandwidth"
        else random_placement(models, slices, seed)
    )
    share = C2C_BW / len(models)
    insts = {}
    for m in models:
        s = slices[placed[m.name]]
        # NOTE: tuned for the 90th-percentile prompt, leaving room in the TTFT target for a burst
        # of BURST prefills queued behind one another.
        prompt = int(np.percentile([r.prompt for r in requests if r.model == m.name] or [512], 90))
        budget = s.memory // 4
        chunk = (
            prefill_chunk(profile_table(m, s, prompt, 0.0, share), m.ttft_target / BURST, budget)
            if policy.chunk == "tuned"
            else DEFAULT_CHUNK
        )
        tuned = policy.alpha == "tuned"
        ctl = AlphaController(alpha=0.0 if tuned else STATIC_ALPHA)
        insts[m.name] = Instance(m, s, chunk, ctl, tuned)
    return insts


def _advance(insts: dict[str, Instance], now: float, dt: float) -> list[float]:
    """Every step in flight moves on by dt, sharing the C2C link: the C2C bytes each one moved."""
    active = [i for i in insts.values() if i.step is not None]
    demand = sum(i.step[2] / _alone(i) for i in active)  # type: ignore[index,misc]
    scale = min(1.0, C2C_BW / demand) if demand else 1.0
    moved = []
    for inst in active:
        _, _, c2c, hbm, flops = inst.step  # type: ignore[misc]
        t_alone = _alone(inst)
        # NOTE: proportional sharing: when the steps in flight ask C2C for more than it has,
        # every one's C2C rate is scaled down alike, and its step stretches by the same factor.
        t = t_alone / scale if c2c > 0 else t_alone
        frac = dt / t
        inst.window[0] += c2c * min(frac, 1 - inst.done_frac)
        inst.window[1] += hbm * min(frac, 1 - inst.done_frac)
        inst.window[2] += dt
        moved.append(c2c * min(frac, 1 - inst.done_frac))
        inst.done_frac += frac
        if inst.done_frac >= 1.0:
            if inst.step[0] == "decode":  # type: ignore[index]
                inst.last_tpot = t
            _finish_step(inst, now + dt)
    return moved


def _tune(insts: dict[str, Instance], share: float) -> None:
    """Each tuned controller sees its window's C2C and HBM utilisation; every window restarts."""
    for inst in insts.values():
        if inst.tune_alpha and inst.window[2] > 0:
            busy = inst.window[2]
            u_c2c = inst.window[0] / (share * busy)
            u_hbm = inst.window[1] / (inst.slice.hbm_bw * busy)
            inst.controller.update(u_c2c, u_hbm, inst.last_tpot, inst.model.tpot_target)
        inst.window = [0.0, 0.0, 0.0]


def _report(requests: list[Request], models: list[ModelShape], insts: dict, util: list) -> dict:
    slo = {m.name: (m.ttft_target, m.tpot_target) for m in models}
    done = [r for r in requests if r.done is not None and r.first_token is not None]
    ttft = [r.first_token - r.arrival for r in done]  # type: ignore[operator]
    tpot = [(r.done - r.first_token) / max(r.generated - 1, 1) for r in done]  # type: ignore[operator]
    ok = [
        r
        for r, a, b in zip(done, ttft, tpot, strict=True)
        if a <= slo[r.model][0] and b <= slo[r.model][1]
    ]
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan")  # noqa: E731
    return {
        "completed": len(done),
        "total": len(requests),
        "p50_ttft": pct(ttft, 50),
        "p99_ttft": pct(ttft, 99),
        "p50_tpot": pct(tpot, 50),
        "p99_tpot": pct(tpot, 99),
        "slo_attainment": len(ok) / max(len(requests), 1),
        "c2c_utilisation": util,
        "alpha": {k: round(i.controller.alpha, 3) for k, i in insts.items()},
        "chunk": {k: i.chunk for k, i in insts.items()},
        "placement": {k: i.slice.name for k, i in insts.items()},
    }


def bursty_trace(
    models: list[ModelShape], duration: float, rate: float, cv: float, seed: int = 0
) -> list[Request]:
    rng = random.Random(seed)
    out: list[Request] = []
    t = 0.0
    shape = 1 / (cv * cv)
    while True:
        t += rng.gammavariate(shape, 1 / (rate * shape))
        if t > duration:
            return out
        prompt = int(min(8192, max(64, rng.lognormvariate(6.5, 0.8))))
        output = int(min(512, max(8, rng.lognormvariate(4.5, 0.6))))
        out.append(Request(t, rng.choice(models).name, prompt, output))


DEFAULT_MODELS = (
    ModelShape("llama-8b", 4096, 14336, 32, 4096, 1024, tpot_target=0.15, ttft_target=3.0),
    ModelShape("llama-3b", 3072, 8192, 28, 3072, 1024, tpot_target=0.1, ttft_target=2.0),
    ModelShape("llama-1b", 2048, 8192, 16, 2048, 512, tpot_target=0.05, ttft_target=1.0),
)
DEFAULT_SLICES = "1g.12gb,1g.12gb,1g.12gb,1g.12gb,1g.24gb,2g.24gb,3g.48gb"  # 7 slices of a GH200


def azure_rows(path: str, duration: float) -> list[tuple[float, int, int]]:
    """(seconds since the first request, context tokens, generated tokens) of an Azure LLM
    inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens), up to `duration`."""
    import csv
    from datetime import datetime

    out: list[tuple[float, int, int]] = []
    t0 = None
    with open(path) as f:
        for row in csv.DictReader(f):
            ts = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26]).timestamp()
            t0 = ts if t0 is None else t0
            if ts - t0 > duration:
                break
            out.append(
                (ts - t0, max(1, int(row["ContextTokens"])), max(1, int(row["GeneratedTokens"])))
            )
    return out


def azure_trace(path: str, models: list[ModelShape], duration: float) -> list[Request]:
    """An Azure-format trace as requests; models are assigned round-robin."""
    return [
        Request(t, models[i % len(models)].name, prompt, output)
        for i, (t, prompt, output) in enumerate(azure_rows(path, duration))
    ]


def sparkline(util: list[tuple[float, float]], width: int = 40) -> str:
    if not util:
        return ""
    bars = " .:-=+*#%@"
    values = [u for _, u in util]
    step = max(1, len(values) // width)
    cells = [max(values[i : i + step]) for i in range(0, len(values), step)]
    return "".join(bars[min(len(bars) - 1, int(v * (len(bars) - 1)))] for v in cells)
