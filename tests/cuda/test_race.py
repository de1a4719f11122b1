"""simcuda runs work later, ordered only as CUDA orders it, and its race checker fails an access
that races with another stream's (tests/cuda/programs/race.c)."""

from __future__ import annotations

import pytest

from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

CHECKED = {"MEDUSA_SIM_RACECHECK": "1"}


@pytest.fixture(scope="module")
def prog(cprog):
    return cprog("race")


def test_a_kernel_and_a_copy_on_two_streams_without_an_event_are_a_race(prog, run):
    res = run(prog, "missing", env=CHECKED)
    out = lines(res.stdout)
    assert out["device sync"] == "cudaErrorLaunchFailure"
    msg = out["message"]
    assert "racecheck: a race on" in msg
    assert "kernel scale_inplace on stream 0x" in msg
    assert "16384-byte copy from device to pinned host memory on stream 0x" in msg
    assert "bytes 0..16384 of the 16384-byte block" in msg
    assert "MEDUSA_SIM_SCHEDULE_SEED=1" in msg
    assert msg in res.stderr
    # deferred execution shows the bug: the copy ran before the kernel it did not wait for
    assert out["sum"] == "4096"


@pytest.mark.parametrize("seed", range(1, 21))
def test_with_the_event_the_copy_sees_the_kernel_under_any_schedule(prog, run, seed):
    out = lines(run(prog, "ordered", env={**CHECKED, "MEDUSA_SIM_SCHEDULE_SEED": str(seed)}).stdout)
    assert out["device sync"] == "cudaSuccess", out["message"]
    assert out["sum"] == str(3 * 4096)


def test_neighbouring_blocks_in_one_page_are_not_a_race(prog, run):
    out = lines(run(prog, "neighbors", env=CHECKED).stdout)
    assert out["same page"] == "1"
    assert out["device sync"] == "cudaSuccess"


def test_graph_nodes_with_no_path_between_them_race_and_an_edge_orders_them(prog, run):
    out = lines(run(prog, "graph", env=CHECKED).stdout)
    assert out["device sync"] == "cudaErrorLaunchFailure"
    assert "graph node 0 (a memset)" in out["message"]
    assert "graph node 1 (a memset)" in out["message"]
    assert "an edge between the nodes" in out["message"]
    assert lines(run(prog, "edge", env=CHECKED).stdout)["device sync"] == "cudaSuccess"


def test_the_legacy_stream_waits_for_blocking_streams_only(prog, run):
    blocking = lines(run(prog, "legacy", env=CHECKED).stdout)
    assert blocking["first"] == "5"
    assert blocking["device sync"] == "cudaSuccess"
    res = run(prog, "nonblock", env=CHECKED)
    assert lines(res.stdout)["device sync"] == "cudaErrorLaunchFailure"
    assert "on the legacy default stream" in res.stderr


def test_the_schedule_seed_picks_the_order_and_reproduces_it(prog, run):
    def last(seed: int) -> str:
        env = {"MEDUSA_SIM_RACECHECK": "0", "MEDUSA_SIM_SCHEDULE_SEED": str(seed)}
        return lines(run(prog, "order", env=env).stdout)["last"]

    seen = {seed: last(seed) for seed in range(1, 9)}
    assert set(seen.values()) == {"1", "2"}, seen
    assert all(last(seed) == seen[seed] for seed in (1, 2))
    res = run(prog, "order", env=CHECKED)
    assert "4-byte memset on stream" in res.stderr


def test_work_runs_later_and_a_pageable_source_is_consumed_at_the_call(prog, run):
    out = lines(run(prog, "deferred", env=CHECKED).stdout)
    assert out["before sync"] == "-1"
    assert out["query"] == "cudaErrorNotReady"
    assert out["sync"] == "cudaSuccess"
    assert out["after sync"] == "7"
    assert out["query after"] == "cudaSuccess"


def test_event_waits_across_a_capture_boundary_are_refused_as_the_driver_does(cprog, run):
    out = lines(run(cprog("event_waits"), env=CHECKED).stdout)
    assert out["external outside capture"] == "cudaErrorIllegalState"  # as an H200's driver
    assert out["wait on never-recorded"] == "cudaSuccess"
    assert out["wait on outside event"] == "cudaErrorStreamCaptureIsolation"
    assert out["end"] == "cudaErrorStreamCaptureInvalidated"


def test_host_functions_and_host_nodes_run_in_stream_order_without_cuda(prog, run):
    out = lines(run(prog, "host", env=CHECKED).stdout)
    assert out["seen before sync"] == "-1"
    assert out["seen"] == "6"
    assert out["cuda in a host function"] == "cudaErrorNotPermitted"
    assert out["seen in a graph"] == "18"
