"""The superchip simulator: each policy can be switched alone and shows in the results; the CLI
prints the summary; an Azure-format trace replays."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from medusa.c2c.link_simulator import (
    DEFAULT_MODELS,
    DEFAULT_SLICES,
    Policy,
    azure_trace,
    bursty_trace,
    simulate,
)
from medusa.c2c.model import GH200_MIG

SLICES = [GH200_MIG[p] for p in DEFAULT_SLICES.split(",")]


def _run(policy: Policy, seed: int = 0) -> dict:
    trace = bursty_trace(list(DEFAULT_MODELS), 30, 1.0, 3.0, seed)
    return simulate(list(DEFAULT_MODELS), SLICES, copy.deepcopy(trace), policy, seed=seed)


def test_every_request_completes_and_the_policies_show():
    best = _run(Policy())
    assert best["completed"] == best["total"] > 10
    assert best["placement"]["llama-8b"] == "3g.48gb"  # the heaviest model on the fastest slice
    assert set(best["alpha"].values()) == {0.0}  # decode is C2C-bound: all weight-stationary
    static = _run(Policy(alpha="static"))
    assert set(static["alpha"].values()) == {1.0}
    assert static["p99_ttft"] > best["p99_ttft"]
    default = _run(Policy(chunk="default"))
    assert set(default["chunk"].values()) == {256} and best["chunk"]["llama-1b"] > 256
    assert 0.0 <= best["slo_attainment"] <= 1.0 and best["c2c_utilisation"]


@pytest.mark.e2e
def test_azure_trace_and_cli(tmp_path):
    csv = tmp_path / "azure.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"2023-11-16 18:15:{i:02d}.000000,{300 + 10 * i},{40 + i}" for i in range(20)
    ]
    csv.write_text("\n".join(rows) + "\n")
    reqs = azure_trace(str(csv), list(DEFAULT_MODELS), 60)
    assert len(reqs) == 20 and reqs[3].arrival == 3.0 and reqs[3].prompt == 330
    res = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "simulate", "--trace", str(csv)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "p99_ttft" in res.stdout and "C2C utilisation |" in res.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "simulate", "--slices", "9g.1tb"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "unknown profile" in bad.stderr
