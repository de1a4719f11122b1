"""Moore-Hodgson orders one device's queue: its deadline misses equal the brute-force minimum over
every order of random instances, and the queue serves requests that can still make it first."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from medusa.prism.schedule import DeviceQueue, Job, misses, moore_hodgson

# times in 1/64 s: sums are exact, so "late" never hangs on a rounding
ticks = st.integers(0, 1280).map(lambda t: t / 64)
jobs_st = st.lists(
    st.builds(Job, deadline=ticks, length=st.integers(1, 384).map(lambda t: t / 64)),
    min_size=0,
    max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(jobs_st, st.integers(0, 192).map(lambda t: t / 64))
def test_misses_equal_the_brute_force_minimum(jobs, start):
    on_time, late = moore_hodgson(jobs, start)
    assert sorted(map(id, on_time + late)) == sorted(map(id, jobs))
    assert misses(on_time, start) == 0  # the schedule it returns keeps what it promises
    best = min(misses(p, start) for p in itertools.permutations(jobs)) if jobs else 0
    assert misses(on_time + late, start) == len(late) == best


def test_random_instances_up_to_eight_jobs():
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(1, 8)
        jobs = [Job(rng.randint(0, 640) / 64, rng.randint(6, 256) / 64) for _ in range(n)]
        _, late = moore_hodgson(jobs)
        assert len(late) == min(misses(p) for p in itertools.permutations(jobs))


def test_the_queue_skips_a_request_that_cannot_make_it_for_two_that_can():
    q = DeviceQueue(prefill_speed=1000.0)  # tokens/s
    q.push("long", arrival=0.0, slo_ttft=1.0, prompt_tokens=900)  # 0.9 s, deadline 1.0
    q.push("a", arrival=0.0, slo_ttft=0.5, prompt_tokens=300)  # 0.3 s, deadline 0.5
    q.push("b", arrival=0.1, slo_ttft=0.6, prompt_tokens=300)  # 0.3 s, deadline 0.7
    # by deadline: a, b, long -> long would end at 1.5; dropping it keeps a and b on time
    assert [q.pop(0.0), q.pop(0.3), q.pop(0.6)] == ["a", "b", "long"]
    with pytest.raises(IndexError):
        q.pop(1.0)
    with pytest.raises(ValueError, match="prefill_speed"):
        DeviceQueue(0)
