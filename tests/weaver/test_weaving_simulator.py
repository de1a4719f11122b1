"""`medusa simulate --weaving` (medusa.weaver.command.simulate_weaving): on the paper-scale
profiles weaving gives the hot model >= 1.4x its dedicated throughput with the cold model's TPOT
within +10%; splitting lowers the head-of-line wait where there is no slack."""

from __future__ import annotations

import pytest

from medusa.weaver.command import simulate_weaving
from medusa.weaver.weaving_simulator import PROFILES, balanced_hol, dedicated, weaving


@pytest.mark.parametrize("name", ["a100", "l40s"])
def test_weaving_lifts_hot_throughput_within_the_cold_budget(name):
    r = simulate_weaving(profiles=name, as_json=True, echo=lambda _s: None)[name]
    ded, best = r["dedicated"], r["weaving best"]
    assert best["hot_tput"] >= 1.4 * ded["hot_tput"]
    assert best["cold_tpot"] <= 1.10 * ded["cold_tpot"]
    assert best["hot_batch"] > 1.5 * ded["hot_batch"]
    assert r["multiplexing"]["cold_tpot"] > 2 * ded["cold_tpot"]


def test_no_offload_is_dedicated_and_splitting_bounds_the_wait():
    p = PROFILES["l40s"]
    none, ded = weaving(p, 0.0), dedicated(p)
    assert (none.hot_batch, none.hot_tput, none.cold_tpot) == (
        ded.hot_batch, pytest.approx(ded.hot_tput), pytest.approx(ded.cold_tpot)
    )  # fmt: skip
    unsplit, split = balanced_hol(p)
    assert split.wait < unsplit.wait and split.extra_launches > 0


def test_table_and_refusals():
    lines: list[str] = []
    simulate_weaving(profiles="simcuda", echo=lines.append)
    names = [ln.split()[0] for ln in lines[2:6]]
    assert names == ["dedicated", "multiplexing", "weaving", "weaving"]
    with pytest.raises(ValueError, match="unknown \\['h100'\\]"):
        simulate_weaving(profiles="h100")
    with pytest.raises(ValueError, match="--ratio 2"):
        simulate_weaving(ratio=2)
