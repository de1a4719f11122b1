"""Weaving simulated: a hot model's KV-bound decode next to a cold model, on two devices, under
three policies, in closed form per decode step (Weaver's setting: Llama-3-8B on A100 / L40S).

- dedicated: the hot model alone on device 0, its batch bounded by the KV that fits there; the
  cold model alone on device 1.
- multiplexing: both models tensor-parallel over both devices (AlpaServe/MuxServe-like), the hot
  batch bounded by the KV room both leave; two all-reduces per layer over the link; the cold
  model's steps interleave with the hot model's (temporal sharing while it is active).
- weaving: the hot model on device 0 offloads the attention of a share `ratio` of its sequences,
  with their KV, to device 1, where the cold model runs. Per layer the hot model runs its GEMMs
  and small ops, its own attention K, and waits for the offloaded attention N (plus the link) past
  K; the receiver takes the task at its next kernel boundary, so while the cold model is active
  the wait is the head-of-line model of medusa/weaver/splitting.py on the cold model's operators,
  halved until it is under 5% of the hot step. The cold model's TPOT grows by the extra launches
  of the split, a poll per kernel and the offloaded attention that does not fit in the memory
  bandwidth its own small-batch decode leaves idle (`cold_bw_use`): with the offload taking a
  share rho of the receiver, TPOT' = TPOT x max(1, cold_bw_use / (1 - rho)).

Operator times are `OpCost` lines, seconds = max(floor, fixed + per_row x rows). The `simcuda`
profile is measured from our kernels (scripts/bench/weaver.py: one SmolLM2-135M layer, rows =
batch, or KV tokens read for attention); the paper-scale profiles are rooflines of Llama-3-8B on
A100-80GB (NVLink) and L40S-48GB (PCIe), with the context length set so that the dedicated batch
is Weaver's 118 on the A100."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from medusa.weaver.splitting import Split, split_operators

GB = 1e9
RATIOS = tuple(i / 20 for i in range(21))


@dataclass(frozen=True)
class OpCost:
    fixed: float  # seconds
    per_row: float  # seconds per row (batch row; KV token for attention)
    floor: float = 0.0  # seconds: the memory-bound time a compute line cannot go under

    def __call__(self, rows: float) -> float:
        return max(self.floor, self.fixed + self.per_row * rows)


@dataclass(frozen=True)
class Profile:
    name: str
    source: str
    memory: float  # bytes usable per device
    hot_weights: float
    cold_weights: float
    kv_per_token: float  # bytes, all layers (the same architecture hot and cold)
    layers: int
    ops: dict[str, OpCost]  # one layer's operators other than attention, rows = batch
    attention: OpCost  # one layer's attention, rows = KV tokens read
    link_per_row: float  # seconds per offloaded sequence per layer (q, k, v out, output back)
    link_latency: float  # seconds per offloaded task
    allreduce: OpCost  # one tensor-parallel all-reduce, rows = batch
    launch: float  # seconds per extra kernel of a split
    poll: float  # seconds per poll at a receiver kernel boundary
    cold_bw_use: float  # share of the receiver's bandwidth the cold decode uses by itself
    context: int = 3621  # KV tokens a hot sequence holds (prompt and output so far)
    cold_batch: int = 4
    cold_context: int = 1000
    cold_active: float = 0.3  # share of time the cold model has requests

    def step(self, batch: float, context: float, tp: int = 1) -> float:
        """A decode step at `batch` (tp: tensor-parallel over that many devices)."""
        per = sum(op(batch) for op in self.ops.values()) + self.attention(batch * context)
        comm = 2 * self.allreduce(batch) if tp > 1 else 0.0
        return self.layers * (per / tp + comm)

    def batch_for(self, room: float, context: float) -> int:
        return max(0, math.floor(room / (context * self.kv_per_token)))

    @property
    def cold_kv(self) -> float:
        return self.cold_batch * self.cold_context * self.kv_per_token


@dataclass(frozen=True)
class Result:
    policy: str
    hot_batch: int
    hot_tpot: float
    hot_tput: float  # tokens/s
    cold_tpot: float
    ratio: float = 0.0
    wait: float = 0.0  # hot wait per layer (head-of-line blocking), seconds
    wait_unsplit: float = 0.0
    splits: int = 0  # extra kernels per cold layer
    extra: dict[str, float] = field(default_factory=dict)


def dedicated(p: Profile) -> Result:
    b = p.batch_for(p.memory - p.hot_weights, p.context)
    t = p.step(b, p.context)
    return Result("dedicated", b, t, b / t, p.step(p.cold_batch, p.cold_context))


def multiplexing(p: Profile) -> Result:
    room = 2 * p.memory - p.hot_weights - p.cold_weights - p.cold_kv
    b = p.batch_for(room, p.context)
    hot, cold = p.step(b, p.context, tp=2), p.step(p.cold_batch, p.cold_context, tp=2)
    # NOTE: while the cold model is active every hot step waits for one cold step, and back.
    return Result("multiplexing", b, hot + p.cold_active * cold,
                  b / (hot + p.cold_active * cold), cold + hot)  # fmt: skip


def weaving(p: Profile, ratio: float) -> Result:
    own_room = p.memory - p.hot_weights
    far_room = p.memory - p.cold_weights - p.cold_kv
    b = min(
        p.batch_for(own_room, p.context * (1 - ratio)) if ratio < 1 else 10**9,
        p.batch_for(far_room, p.context * ratio) if ratio > 0 else 10**9,
    )
    own, off = b * (1 - ratio), b * ratio
    k = p.attention(own * p.context) if own else 0.0
    n = (p.attention(off * p.context) + p.link_per_row * off + p.link_latency) if off else 0.0
    body = sum(op(b) for op in p.ops.values())
    cold_ops = [op(p.cold_batch) for op in p.ops.values()]
    cold_ops.append(p.attention(p.cold_batch * p.cold_context))
    base = p.layers * (body + k)
    split = split_operators(cold_ops, k, n, base, tasks_per_iteration=p.layers) if off else None
    idle = max(n - k, 0.0)
    if split is None:
        wait = unsplit = 0.0
    else:
        busy_split = split_operators(cold_ops, k, n, base, p.layers, target=math.inf)
        unsplit = p.cold_active * busy_split.wait + (1 - p.cold_active) * idle
        wait = p.cold_active * split.wait + (1 - p.cold_active) * idle
    hot = base + p.layers * wait
    extra = split.extra_launches if split else 0
    cold = p.step(p.cold_batch, p.cold_context)
    if off:
        cold += p.layers * (extra * p.launch + (extra + len(cold_ops)) * p.poll)
        rho = p.layers * (n - p.link_latency) / hot
        cold = cold * max(1.0, p.cold_bw_use / (1 - rho)) if rho < 1 else math.inf
    return Result("weaving", b, hot, b / hot, cold, ratio, wait, unsplit, extra,
                  {"offloaded_attention": n, "own_attention": k})  # fmt: skip


def balanced_hol(p: Profile, ratio: float = 0.45) -> tuple[Split, Split]:
    """The head-of-line model where splitting matters: offloaded attention as long as the hot
    model's own (K = N, no slack), cold model busy; (unsplit, split) per layer."""
    r = weaving(p, ratio)
    n = r.extra.get("offloaded_attention", 0.0)
    cold_ops = [op(p.cold_batch) for op in p.ops.values()]
    cold_ops.append(p.attention(p.cold_batch * p.cold_context))
    return (split_operators(cold_ops, n, n, r.hot_tpot, p.layers, target=math.inf),
            split_operators(cold_ops, n, n, r.hot_tpot, p.layers))  # fmt: skip


def best_weaving(p: Profile, cold_budget: float = 0.10) -> Result:
    """The ratio (in steps of 0.05) with the most hot throughput whose cold TPOT stays within
    `cold_budget` of the cold model's TPOT on its own device."""
    limit = dedicated(p).cold_tpot * (1 + cold_budget)
    ok = [r for r in (weaving(p, x) for x in RATIOS) if r.cold_tpot <= limit]
    return max(ok, key=lambda r: r.hot_tput)


def compare(p: Profile, ratio: float = 0.45, cold_budget: float = 0.10) -> dict[str, Result]:
    return {
        "dedicated": dedicated(p),
        "multiplexing": multiplexing(p),
        f"weaving {ratio:g}": weaving(p, ratio),
        "weaving best": best_weaving(p, cold_budget),
    }


def _roofline(bw: float, flops: float, params: float, launch: float) -> OpCost:
    """A GEMM of `params` bf16 weights: weight bytes at `bw`, 2 flops per weight and row."""
    return OpCost(launch, 2 * params / flops, floor=2 * params / bw)


def _llama3_8b(name: str, source: str, memory: float, bw: float, flops: float, link_bw: float,
               link_latency: float, allreduce_latency: float) -> Profile:  # fmt: skip
    h, kv, ff, launch = 4096, 1024, 14336, 5e-6
    small = OpCost(launch, 2 * h * 2 * 3 / bw)  # a norm, RoPE, SiLU: a few passes over [b, h]
    ops = {
        "rms_norm": small, "qkv_proj": _roofline(bw, flops, h * (h + 2 * kv), launch),
        "rope": small, "o_proj": _roofline(bw, flops, h * h, launch),
        "rms_norm_2": small, "gate_up": _roofline(bw, flops, h * 2 * ff, launch),
        "silu_mul": small, "down_proj": _roofline(bw, flops, ff * h, launch),
    }  # fmt: skip
    row = (2 * h + 2 * kv) * 2  # q, k, v there and the output back, bf16
    return Profile(
        name, source, memory, hot_weights=16.06 * GB, cold_weights=16.06 * GB,
        kv_per_token=2 * 32 * kv * 2, layers=32, ops=ops,
        attention=OpCost(launch, 2 * kv * 2 / bw), link_per_row=row / link_bw,
        link_latency=link_latency,
        allreduce=OpCost(allreduce_latency, h * 2 / link_bw), launch=launch, poll=2e-6,
        cold_bw_use=0.5,
    )  # fmt: skip


# Sustained (not peak) figures: 80% of HBM bandwidth, 60% of dense bf16 FLOP/s, 90% of memory.
A100 = _llama3_8b(
    "a100", "Llama-3-8B bf16 roofline on A100-80GB SXM (2.04 TB/s, 312 TFLOP/s, NVLink 300 GB/s)",
    0.9 * 80 * GB, 0.8 * 2.04e12, 0.6 * 312e12, 300 * GB, 10e-6, 30e-6,
)  # fmt: skip
L40S = _llama3_8b(
    "l40s", "Llama-3-8B bf16 roofline on L40S-48GB (864 GB/s, 362 TFLOP/s, PCIe 4.0 x16 25 GB/s)",
    0.9 * 48 * GB, 0.8 * 864e9, 0.6 * 362e12, 25 * GB, 15e-6, 60e-6,
)  # fmt: skip

# Measured on simcuda by scripts/bench/weaver.py (2-core development machine, one BLAS thread,
# one SmolLM2-135M layer, fp32; a busy machine: the GEMM lines carry noise of about 2x at b=64).
SIMCUDA_OPS = {
    "rms_norm": OpCost(2.03e-05, 7.05e-07),
    "qkv_proj": OpCost(0.000239, 1.48e-05),
    "rope": OpCost(1.99e-05, 9.89e-07),
    "cache": OpCost(2.14e-05, 7.11e-08),
    "o_proj": OpCost(0.000146, 8.11e-06),
    "rms_norm_2": OpCost(2.03e-05, 7.05e-07),
    "gate_up": OpCost(0.000613, 0.00011),
    "silu_mul": OpCost(7.04e-06, 5.22e-06),
    "down_proj": OpCost(0.000303, 1.84e-05),
}
SIMCUDA_ATTENTION = OpCost(0.0, 2.1e-06)
SIMCUDA = Profile(
    "simcuda",
    "SmolLM2-135M fp32 on simcuda slices of 2 GB, operator times measured by "
    "scripts/bench/weaver.py; nothing overlaps on a CPU (cold_bw_use 1)",
    memory=2 * GB, hot_weights=0.54 * GB, cold_weights=0.54 * GB, kv_per_token=2 * 30 * 192 * 4,
    layers=30, ops=SIMCUDA_OPS, attention=SIMCUDA_ATTENTION,
    link_per_row=(576 * 2 + 192 * 2) * 4 / (5 * GB), link_latency=20e-6,
    allreduce=OpCost(20e-6, 576 * 4 / (5 * GB)), launch=0.2e-6, poll=5e-6, cold_bw_use=1.0,
    context=1024, cold_batch=4, cold_context=512,
)  # fmt: skip
PROFILES = {p.name: p for p in (SIMCUDA, A100, L40S)}
PAPER = {  # Weaver (ATC'25), Llama-3-8B: hot throughput vs dedicated / vs multiplexing
    "a100": "+60% vs dedicated, +22% vs multiplexing, batch 118 -> 231, cold TPOT +3-5 ms",
    "l40s": "+60% vs dedicated, +77% vs multiplexing, cold TPOT +3-5 ms",
}
__all__ = ["PROFILES", "PAPER", "Profile", "OpCost", "Result", "compare", "replace"]
