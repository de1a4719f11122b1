"""The MILP planner and the pipelining simulator."""

from __future__ import annotations

import numpy as np
import pytest

from medusa.tessera.pipeline_simulator import simulate
from medusa.tessera.planner import Device, Link, Problem, evaluate, solve
from medusa.tessera.profiles import H100, LLAMA3_8B, PCIE5, RTX_PRO_6000, decode_problem

TWO = [Device("fast", 80e9), Device("slow", 96e9)]


def chain(n: int, seed: int = 0, ratio: float = 1.0) -> Problem:
    rng = np.random.default_rng(seed)
    base = rng.uniform(10e-6, 100e-6, n)
    edges = [(i, i + 1, float(rng.uniform(1e4, 1e5))) for i in range(n - 1)]
    return Problem(TWO, np.stack([base, base * ratio], 1), edges, Link(5e-6, 50e9))


def test_throughput_balances_two_devices_and_latency_avoids_cuts():
    p = chain(1000, ratio=1.8)
    plan = solve(p, "throughput")
    alone = float(p.times[:, 0].sum())
    assert plan.period < 0.7 * alone  # both devices work
    assert abs(plan.compute[0] - plan.compute[1]) < 0.05 * alone
    lat = solve(p, "latency")
    assert set(lat.placement) == {0} and lat.objective == pytest.approx(alone)


def test_pins_memory_and_fixed_kernels_are_respected():
    p = chain(40)
    p = Problem(
        p.devices, p.times, p.edges, p.link, memory=np.full(40, 1.0), pinned=[{3, 30}], fixed={0: 1}
    )
    p = Problem(
        [Device("a", 25.0), Device("b", 25.0)],
        p.times,
        p.edges,
        p.link,
        memory=p.memory,
        pinned=p.pinned,
        fixed=p.fixed,
    )
    plan = solve(p)
    assert plan.placement[3] == plan.placement[30] and plan.placement[0] == 1
    assert max(plan.placement.count(d) for d in (0, 1)) <= 25
    with pytest.raises(ValueError, match="no placement fits"):
        solve(
            Problem(
                [Device("a", 10.0), Device("b", 10.0)], p.times, p.edges, p.link, memory=p.memory
            )
        )


def test_pipelining_fills_the_devices():
    p = chain(200)
    plan = solve(p)
    optimal = 1 / plan.period
    alone = simulate(p, plan.placement, 32, window=1) / optimal
    piped = simulate(p, plan.placement, 32, window=8) / optimal
    assert 0.4 < alone < 0.6 and piped > 0.9
    assert evaluate(p, plan.placement) == (plan.compute, plan.transfer)


def test_the_heterogeneous_pair_beats_the_faster_device_alone():
    h100 = max(
        b / float(decode_problem([H100], PCIE5, LLAMA3_8B, b, 4096).times.sum())
        for b in (32, 64, 96)
        if decode_problem([H100], PCIE5, LLAMA3_8B, b, 4096).memory.sum() <= 72e9
    )
    pair = 160 / solve(decode_problem([H100, RTX_PRO_6000], PCIE5, LLAMA3_8B, 160, 4096)).period
    assert pair >= 1.5 * h100
