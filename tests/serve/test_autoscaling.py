"""The gateway's autoscaling policy, on plain numbers: when a request starts another worker or is
refused, which idle workers stop, how many start to keep min_instances."""

from __future__ import annotations

from medusa.serve.gateway.autoscaling import (
    WorkerLoad,
    queue_full,
    shortfall,
    to_stop,
    wants_another,
)
from medusa.serve.gateway.config import ModelConfig

CFG = ModelConfig("m", min_instances=1, max_instances=3, target=4, keep_alive=60.0, max_queue=8)


def test_a_cold_model_starts_a_worker_for_its_first_request() -> None:
    assert wants_another(CFG, num_active=0, load=1)


def test_another_worker_starts_only_past_target_requests_each_and_below_max_instances() -> None:
    assert not wants_another(CFG, num_active=2, load=8)  # 4 each: enough
    assert wants_another(CFG, num_active=2, load=9)
    assert not wants_another(CFG, num_active=3, load=100)  # max_instances reached


def test_requests_queue_beyond_target_per_warm_worker_up_to_max_queue() -> None:
    # two warm workers take 4 each; what is beyond that, and what waits, counts as queued
    assert not queue_full(CFG, num_warm=2, inflight=8, waiting=7)
    assert queue_full(CFG, num_warm=2, inflight=8, waiting=8)
    assert queue_full(CFG, num_warm=0, inflight=0, waiting=8)  # nothing warm: all of it waits


def test_idle_workers_stop_after_keep_alive_down_to_min_instances() -> None:
    warm = [WorkerLoad(0, 61.0), WorkerLoad(0, 120.0), WorkerLoad(0, 10.0)]
    assert to_stop(CFG, warm, num_live=3) == [0, 1]  # the third is not idle long enough
    assert to_stop(CFG, warm, num_live=2) == [0]  # one must stay
    assert to_stop(CFG, warm, num_live=1) == []


def test_a_worker_with_requests_in_flight_never_stops() -> None:
    assert to_stop(CFG, [WorkerLoad(1, 600.0), WorkerLoad(0, 600.0)], num_live=3) == [1]


def test_an_idle_worker_on_an_elastic_slice_stays_for_placement_to_evict() -> None:
    warm = [WorkerLoad(0, 600.0, elastic=True), WorkerLoad(0, 600.0)]
    assert to_stop(CFG, warm, num_live=3) == [1]


def test_starting_and_draining_workers_count_against_min_instances() -> None:
    zero = ModelConfig("z", min_instances=0, keep_alive=5.0)
    # one warm idle worker and one draining: the warm one may go (min 0)
    assert to_stop(zero, [WorkerLoad(0, 6.0)], num_live=2) == [0]
    # min 1, one warm idle worker and one starting: the warm one may go, the starting one stays
    assert to_stop(CFG, [WorkerLoad(0, 61.0)], num_live=2) == [0]


def test_workers_start_up_to_min_instances() -> None:
    assert shortfall(ModelConfig("m", min_instances=2), num_active=0) == 2
    assert shortfall(ModelConfig("m", min_instances=2), num_active=2) == 0
    assert shortfall(ModelConfig("m", min_instances=0), num_active=1) == 0
