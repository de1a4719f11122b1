"""Weaver's wait formula against sampling, and splitting that brings the wait under 5%."""

from __future__ import annotations

import pytest

from medusa.weaver.splitting import (
    expected_wait,
    mean_wait,
    monte_carlo_wait,
    paper_wait,
    split_operators,
)


@pytest.mark.parametrize(
    ("t_op", "k", "n"),
    [(1.0, 0.5, 0.2), (2.0, 0.6, 0.5), (0.8, 1.0, 0.9), (3.0, 3.0, 0.0), (1.5, 0.3, 0.3)],
)
def test_formula_matches_monte_carlo_within_two_percent(t_op, k, n):
    sampled = monte_carlo_wait([t_op], k, n, samples=200_000, seed=1)
    assert paper_wait(t_op, k, n) == pytest.approx(sampled, rel=0.02)
    assert expected_wait(t_op, k, n) == paper_wait(t_op, k, n)  # k >= n: the same


def test_many_operators_weighted_by_length_match_sampling():
    ops, k, n = [0.1, 0.9, 0.3, 2.0, 0.05], 0.8, 0.35
    assert mean_wait(ops, k, n) == pytest.approx(monte_carlo_wait(ops, k, n, seed=2), rel=0.02)


def test_paper_formula_overstates_when_offload_outlasts_own_attention():
    t_op, k, n = 1.0, 0.2, 0.7
    sampled = monte_carlo_wait([t_op], k, n, seed=3)
    assert expected_wait(t_op, k, n) == pytest.approx(sampled, rel=0.02)
    assert paper_wait(t_op, k, n) - expected_wait(t_op, k, n) == pytest.approx(0.5**2 / 2)


def test_splitting_halves_the_longest_until_the_wait_is_under_five_percent():
    ops = [4.0, 0.5, 1.0, 0.2]  # ms: one long GEMM
    k, n, iteration = 0.6, 0.3, 10.0
    assert mean_wait(ops, k, n) > 0.05 * iteration
    s = split_operators(ops, k, n, iteration)
    assert s.wait < 0.05 * iteration
    assert s.pieces[0] > 1 and s.pieces[3] == 1  # the long one was split, the short one not
    assert sum(s.ops) == pytest.approx(sum(ops))
    assert s.wait == pytest.approx(monte_carlo_wait(s.ops, k, n, seed=4), rel=0.02)


def test_splitting_stops_when_it_cannot_help():
    s = split_operators([1.0, 1.0], k=0.1, n=0.9, iteration=1.0)  # offload alone is too long
    assert s.extra_launches == 0
    with pytest.raises(ValueError, match="iteration > 0"):
        split_operators([1.0], 0.1, 0.1, 0.0)
