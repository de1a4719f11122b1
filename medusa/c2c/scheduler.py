"""Placement and prefill chunk sizing for superchip serving (C2CServe §6-7)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from medusa.c2c.model import C2C_BW, SliceProfile, gemm_time, gemm_traffic
from medusa.engine.hybrid_gemm import Tiles
from medusa.errors import PlacementError

if TYPE_CHECKING:
    from medusa.engine.spec import ModelSpec

CHUNKS = (128, 256, 512, 1024, 2048, 4096)
# Tiles for full-size GPU GEMMs (the simcuda tests use small ones).
GPU_TILES = Tiles(bm=128, bn=128, bk=64, wbm=128, wbn=128, wbk=256)


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    q_size: int
    kv_size: int
    tpot_target: float = 0.1  # seconds
    ttft_target: float = 2.0
    elem: int = 2  # bf16 weights

    @classmethod
    def from_spec(
        cls, spec: ModelSpec, tpot_target: float = 0.1, ttft_target: float = 2.0, elem: int = 4
    ) -> ModelShape:
        """The shape of an engine model (medusa.engine.spec.ModelSpec); elem 4: fp32 weights."""
        return cls(
            spec.name,
            spec.hidden_size,
            spec.intermediate_size,
            spec.num_layers,
            spec.q_size,
            spec.kv_size,
            tpot_target,
            ttft_target,
            elem,
        )

    @property
    def gemms(self) -> list[tuple[int, int]]:
        """(N, K) of each projection of one layer."""
        d, f = self.hidden, self.intermediate
        return [(self.q_size + 2 * self.kv_size, d), (d, self.q_size), (2 * f, d), (d, f)]

    @property
    def weight_bytes(self) -> int:
        return self.layers * sum(n * k for n, k in self.gemms) * self.elem

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_size * self.elem

    def activation_bytes(self, tokens: int) -> int:
        return tokens * (self.hidden * 4 + self.intermediate * 2 * 4)


def step_time(
    m: ModelShape,
    s: SliceProfile,
    tokens: int,
    alpha: float,
    c2c_share: float,
    tiles: Tiles = GPU_TILES,
) -> float:
    return m.layers * sum(
        gemm_time(gemm_traffic(tokens, n, k, alpha, tiles, m.elem), s, c2c_share)
        for n, k in m.gemms
    )


def admit(
    models: list[ModelShape],
    slices: list[SliceProfile],
    *,
    min_kv_tokens: int = 4096,
    c2c_bw: float = C2C_BW,
) -> dict[str, int]:
    """Bandwidth-aware placement: refuses a set whose decode would oversubscribe C2C (each decode
    step streams every weight once per TPOT), and gives the heaviest models the fastest slices
    that hold their KV cache and activations. Returns model -> slice index."""
    demand = {m.name: m.weight_bytes / m.tpot_target for m in models}
    total = sum(demand.values())
    if total > c2c_bw:
        worst = max(demand, key=lambda k: demand[k])
        raise PlacementError(
            f"C2C demand {total / 1e9:.0f} GB/s (sum of weight bytes / TPOT target; {worst} alone "
            f"{demand[worst] / 1e9:.0f} GB/s) exceeds the link's {c2c_bw / 1e9:.0f} GB/s: serve "
            "fewer models here or relax their TPOT targets"
        )
    free = sorted(range(len(slices)), key=lambda i: slices[i].hbm_bw)
    out = {}
    for m in sorted(models, key=lambda m: demand[m.name], reverse=True):
        need = m.kv_bytes_per_token() * min_kv_tokens + m.activation_bytes(max(CHUNKS))
        fits = [i for i in free if slices[i].memory >= need]
        if not fits:
            raise PlacementError(
                f"{m.name}: needs {need / 2**30:.1f} GiB of HBM for KV and "
                "activations; no free slice has that much"
            )
        best = fits[-1]  # the fastest slice that fits
        out[m.name] = best
        free.remove(best)
    return out


def random_placement(
    models: list[ModelShape], slices: list[SliceProfile], seed: int = 0
) -> dict[str, int]:
    """The baseline: a random free slice each, ignoring bandwidth (memory is still checked)."""
    rng = random.Random(seed)
    free = list(range(len(slices)))
    out = {}
    for m in models:
        need = m.kv_bytes_per_token() * 1024 + m.activation_bytes(512)
        fits = [i for i in free if slices[i].memory >= need] or free
        out[m.name] = rng.choice(fits)
        free.remove(out[m.name])
    return out


def profile_table(
    m: ModelShape, s: SliceProfile, prompt: int, alpha: float, c2c_share: float
) -> list[tuple[int, float, int]]:
    """(chunk, TTFT of a `prompt`-token prefill, HBM bytes of activations) per chunk size."""
    rows = []
    for c in CHUNKS:
        steps = -(-prompt // c)
        ttft = steps * step_time(m, s, min(c, prompt), alpha, c2c_share)
        rows.append((c, ttft, m.activation_bytes(c)))
    return rows


def prefill_chunk(table: list[tuple[int, float, int]], ttft_target: float, hbm_budget: int) -> int:
    """The smallest chunk that meets the TTFT target within the HBM budget (else the fastest)."""
    fitting = [r for r in table if r[2] <= hbm_budget]
    if not fitting:
        return min(table, key=lambda r: r[2])[0]
    meets = [r for r in fitting if r[1] <= ttft_target]
    return (min(meets, key=lambda r: r[0]) if meets else min(fitting, key=lambda r: r[1]))[0]
