"""The simulated workload of medusa.prism.sharing_simulator: a long-tailed catalog of models (Zipf
popularity, sizes of long-tail catalogs) and their requests (bursty arrivals, lognormal lengths),
with the device figures a model's speeds come from."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

GiB = 2**30
DEVICE_MEMORY = 80 * GiB  # an H100
FLOPS = 4e14  # sustained prefill FLOP/s of one device (about 40% of an H100's dense bf16)
HBM = 2.0e12  # bytes/s a decode step streams weights at
SIZES = (1.0, 3.0, 7.0, 8.0, 13.0)  # billions of parameters, as in long-tail catalogs


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


def trace(
    models: Sequence[SimModel], load: float, duration: float, seed: int, cv: float = 2.0
) -> list[Req]:
    """Requests of every model over `duration` s at `load` x their rates: gamma interarrivals
    with coefficient of variation `cv` (bursts), lognormal prompt and output lengths."""
    rng = random.Random(seed)
    reqs: list[Req] = []
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
