# ruff: noqa: F811 - the fixtures come from tests.security._store
"""Findings 7 and 8: host weights changed after they were checked. The gateway vouched for a
store by its file's identity and times, which a write through a shared mapping leaves as they
were, and workers mapped the file itself: a second worker skipped hashing and served the new
bytes, and a running worker served bytes changed in place, with no error. Host weights now live
in a sealed copy nobody can change (the gateway's, checked in full and shared by descriptor, or
a worker's own): whatever happens to the file afterwards, the answers stay those of the model."""

from __future__ import annotations

import time

import pytest

from medusa.weights import WeightStoreError, open_store
from tests.security._store import (  # noqa: F401 - fixtures
    ENGINE,
    HOST,
    Gateway,
    Worker,
    chunk_offset,
    copy_artifact,
    expected_host,
    host_artifact,
    kill_and_wait,
    memfd_inode,
    scribble_through_mapping,
    tiny_model,
)

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def _damaged(store) -> bool:
    try:
        with open_store(store) as s:
            s.verify()
    except WeightStoreError as e:
        return "does not match its checksum" in str(e)
    return False


def test_a_store_written_through_a_mapping_after_the_gateways_check_is_not_served(
    tiny_model, host_artifact, expected_host, tmp_path
):
    art = copy_artifact(host_artifact, tmp_path / "art")
    store = art / "weights.store"
    gw = Gateway(tmp_path, tiny_model, art, ENGINE)
    try:
        assert gw.complete() == expected_host
        deadline = time.monotonic() + 60
        while gw.metric('medusa_gateway_host_weight_bytes{model="h"}') == 0:
            assert time.monotonic() < deadline, "the gateway made no checked copy of the store"
            time.sleep(0.1)
        scribble_through_mapping(store, chunk_offset(store, 1), 1 << 20)
        assert _damaged(store)  # the file now holds other weights than the ones checked
        (first,) = gw.workers()
        assert gw.complete() == expected_host  # its own copy: the file changed nothing
        kill_and_wait(first)
        assert gw.complete() == expected_host  # a new worker, on the gateway's checked copy
        (second,) = gw.workers()
        assert second != first
        assert memfd_inode(second) == memfd_inode(gw.proc.pid) is not None
    finally:
        gw.stop()


def test_a_running_workers_host_store_changed_in_place_changes_nothing_it_serves(
    tiny_model, host_artifact, expected_host, tmp_path
):
    art = copy_artifact(host_artifact, tmp_path / "art")
    store = art / "weights.store"
    with Worker(tiny_model, art, tmp_path, *HOST) as w:
        assert w.complete() == expected_host
        with open(store, "r+b") as f:  # in place, by write(2)
            f.seek(chunk_offset(store, 0) + 4096)
            f.write(bytes([0x7F]) * (1 << 20))
        scribble_through_mapping(store, chunk_offset(store, 2), 1 << 19)
        assert _damaged(store)
        assert w.complete() == expected_host
        assert memfd_inode(w.proc.pid) is not None  # it serves its own sealed copy


def _pooled_with_the_copy(gw: Gateway, deadline: float) -> int:
    """An idle pooled worker mapping the gateway's copy of h's store, once h has scaled down. A
    worker spawned before the copy existed has none: such a one is stopped, and the pool refills."""
    copied, idle = False, []
    while not (copied and not gw.workers() and (idle := gw.pooled())):
        assert time.monotonic() < deadline, f"no pooled worker after h scaled down:\n{gw.log()}"
        copied = copied or gw.metric('medusa_gateway_host_weight_bytes{model="h"}') > 0
        time.sleep(0.1)
    while memfd_inode(idle[0]) is None:
        assert time.monotonic() < deadline, "no pooled worker mapped the gateway's copy"
        kill_and_wait(idle[0])
        while not (idle := gw.pooled()):
            assert time.monotonic() < deadline, "the pool did not refill"
            time.sleep(0.1)
    return idle[0]


def test_a_pooled_worker_maps_the_gateways_checked_copy_at_warm_up_and_serves_from_it(
    tiny_model, host_artifact, expected_host, tmp_path
):
    """Once the gateway holds a checked copy of h's store, a pooled worker warming up maps it
    (its pages read in then, not by h's first request) and h's start from the pool uses it."""
    gw = Gateway(tmp_path, tiny_model, host_artifact, ENGINE, keep_alive=1, warm_pool=1)
    try:
        assert gw.complete() == expected_host  # h starts; the gateway copies its store
        pooled = _pooled_with_the_copy(gw, time.monotonic() + 90)
        assert memfd_inode(pooled) == memfd_inode(gw.proc.pid)
        assert gw.complete() == expected_host
        assert gw.workers() == [pooled]  # h's start took that worker
    finally:
        gw.stop()


def test_an_idle_pooled_worker_unmaps_a_copy_the_gateway_frees(
    tiny_model, host_artifact, expected_host, tmp_path
):
    """The gateway frees h's copy host_keep_alive after h's last worker; an idle pooled worker
    that mapped it lets it go too (else it would hold the copy's memory while it waits)."""
    gw = Gateway(tmp_path, tiny_model, host_artifact, ENGINE, keep_alive=1, warm_pool=1,
                 host_keep_alive=8)  # fmt: skip
    try:
        assert gw.complete() == expected_host
        pooled = _pooled_with_the_copy(gw, time.monotonic() + 90)
        deadline = time.monotonic() + 60
        while gw.metric('medusa_gateway_host_weight_bytes{model="h"}') > 0:
            assert time.monotonic() < deadline, "the gateway kept h's copy past host_keep_alive"
            time.sleep(0.2)
        while memfd_inode(pooled) is not None:
            assert time.monotonic() < deadline, "the idle pooled worker kept the freed copy mapped"
            time.sleep(0.2)
        assert gw.complete() == expected_host  # and h still starts (from the file: no copy)
    finally:
        gw.stop()
