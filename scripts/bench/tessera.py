"""Tessera figures: HiGHS on a 1,000-kernel instance, pipelining against the planner's optimum,
and the heterogeneous pair (H100 + RTX Pro 6000, Llama-3-8B decode) against the H100 alone.
--engine also records SmolLM2's decode graph with access instrumentation and cross-checks it.

    python scripts/bench/tessera.py [--engine]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from medusa.progress import Progress
from medusa.tessera.pipeline_simulator import simulate
from medusa.tessera.planner import Device, Link, Problem, solve
from medusa.tessera.profiles import H100, LLAMA3_8B, PCIE5, RTX_PRO_6000, decode_problem


def milp_1000(runs: int = 5, seeds: int = 10) -> None:
    """`seeds` random 1,000-kernel chains (a skip edge every fifth kernel), each solved `runs`
    times per objective: the median and the worst solve, and the largest gap left."""
    for obj in ("throughput", "latency"):
        medians, worst, gaps = [], 0.0, []
        for seed in range(seeds):
            p = instance_1000(seed)
            plans = [solve(p, obj) for _ in range(runs)]
            times = sorted(pl.solve_seconds for pl in plans)
            medians.append(times[len(times) // 2])
            worst = max(worst, times[-1])
            gaps.append(max(pl.gap for pl in plans))
            if any(not pl.status.endswith("Optimal)") for pl in plans):
                print(f"  seed {seed}: {plans[0].status}")
        medians.sort()
        print(
            f"HiGHS, 1000 kernels, {len(p.edges)} edges, {obj:10s}: median over {seeds} "
            f"instances of the median of {runs} solves {medians[len(medians) // 2]:.2f} s "
            f"(instances {medians[0]:.2f}-{medians[-1]:.2f} s), slowest solve {worst:.2f} s; "
            f"gap left at most {100 * max(gaps):.2f}%"
        )


def instance_1000(seed: int) -> Problem:
    rng = np.random.default_rng(seed)
    n = 1000
    base = rng.uniform(10e-6, 100e-6, n)
    times = np.stack([base, base * rng.uniform(1.5, 2.2, n)], 1)
    edges = [(i, i + 1, rng.uniform(1e4, 1e6)) for i in range(n - 1)]
    edges += [(i, i + 3, rng.uniform(1e4, 1e6)) for i in range(0, n - 3, 5)]
    return Problem([Device("a", 80e9), Device("b", 96e9)], times, edges, Link(5e-6, 50e9))


def pipelining() -> None:
    rng = np.random.default_rng(1)
    n = 200
    base = rng.uniform(10e-6, 100e-6, n)
    p = Problem(
        [Device("a", 80e9), Device("b", 80e9)],
        np.stack([base, base], 1),
        [(i, i + 1, float(rng.uniform(1e4, 1e5))) for i in range(n - 1)],
        Link(5e-6, 50e9),
    )
    plan = solve(p)
    for w in (1, 2, 4, 8, 16):
        share = simulate(p, plan.placement, 64, w) * plan.period
        print(f"pipelining, {w:2d} requests in flight: {100 * share:5.1f}% of optimal")


def heterogeneous(ctx: int = 4096) -> None:
    alone = (0.0, 0)
    pair = (0.0, 0)
    for b in (16, 32, 48, 64, 96, 128, 160):
        one = decode_problem([H100], PCIE5, LLAMA3_8B, b, ctx)
        if one.memory.sum() <= one.devices[0].memory:
            alone = max(alone, (b / float(one.times.sum()), b))
        plan = solve(decode_problem([H100, RTX_PRO_6000], PCIE5, LLAMA3_8B, b, ctx), time_limit=5)
        pair = max(pair, (b / plan.period, b))
    print(
        f"Llama-3-8B decode, {ctx}-token contexts: H100 alone {alone[0]:.0f} tok/s (batch "
        f"{alone[1]}), H100 + RTX Pro 6000 {pair[0]:.0f} tok/s (batch {pair[1]}): "
        f"{pair[0] / alone[0]:.2f}x"
    )


def engine() -> None:
    from medusa.engine.config import EngineConfig
    from medusa.tessera.crosscheck import crosscheck
    from medusa.tessera.record import record_engine

    cfg = EngineConfig(
        max_num_seqs=2, capture_sizes=(1, 2), max_model_len=256, max_num_batched_tokens=64
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        a, b = record_engine(cfg, Path(tmp))
        t1 = time.perf_counter()
        check = crosscheck(a, b)
        print(
            f"SmolLM2 graphs: {check.nodes_checked} kernel nodes checked, "
            f"{len(check.disagreements)} disagreements, {check.nodes_unknown} without accesses "
            f"(recorded in {t1 - t0:.0f} s, checked in {time.perf_counter() - t1:.2f} s)"
        )
        for d in check.disagreements[:10]:
            print("  ", d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--engine", action="store_true")
    args = ap.parse_args()
    progress = Progress(steps=4 if args.engine else 3)
    with progress.step("planning 1,000 kernels (MILP)"):
        milp_1000()
    with progress.step("pipelining"):
        pipelining()
    with progress.step("two unlike devices"):
        heterogeneous()
    if args.engine:
        with progress.step("SmolLM2's decode graphs, recorded and planned"):
            engine()


if __name__ == "__main__":
    main()
