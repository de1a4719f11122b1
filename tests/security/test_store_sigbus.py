# ruff: noqa: F811 - the fixtures come from tests.security._store
"""Finding 6: a weight store cut short while it is read. The worker read its store through a
shared mapping and the gateway checked host-weight stores through one: a file truncated under
the mapping killed the reader with SIGBUS (the gateway, and with it every worker). A store is now
read, never mapped: the worker falls back to the model file, naming the store, and answers as a
normal start does; the gateway logs why it has no checked copy and serves on."""

from __future__ import annotations

import os
import re

import pytest

from tests.security._store import (  # noqa: F401 - fixtures
    ENGINE,
    HOST,
    Gateway,
    Hold,
    Worker,
    alive,
    chunk_offset,
    copy_artifact,
    device_artifact,
    expected,
    expected_host,
    host_artifact,
    tiny_model,
)

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def test_a_device_store_cut_short_while_a_worker_loads_it_falls_back(
    tiny_model, device_artifact, expected, tmp_path
):
    art = copy_artifact(device_artifact, tmp_path / "art")
    store = art / "weights.store"
    hold = Hold(tmp_path / "hold", chunk=1)
    w = Worker(tiny_model, art, tmp_path, env=hold.env())
    try:
        hold.held(w.proc.pid)  # chunk 0 is on the device, the rest not yet read
        os.truncate(store, chunk_offset(store, 1) + 100)
        hold.go(w.proc.pid)
        w.ready()
        assert w.complete() == expected
    finally:
        log = w.stop()
    assert "weight store not used, loading the model file" in log
    # chunks 1 and 2 are both cut: the copy's two threads (one per core) may meet either first
    assert re.search(rf"{re.escape(str(store))}: chunk [12] of 3 could not be read", log), log


def test_a_host_store_cut_short_while_the_gateway_copies_it_leaves_the_gateway_up(
    tiny_model, host_artifact, expected_host, tmp_path
):
    art = copy_artifact(host_artifact, tmp_path / "art")
    store = art / "weights.store"
    hold = Hold(tmp_path / "hold", chunk=1)
    gw = Gateway(tmp_path, tiny_model, art, ENGINE, env=hold.env())
    try:
        hold.auto_release(keep=gw.proc.pid)  # workers read on; the gateway stops at chunk 1
        assert gw.complete() == expected_host  # its first worker serves: the gateway copies
        hold.held(gw.proc.pid)
        os.truncate(store, chunk_offset(store, 1) + 100)
        hold.go(gw.proc.pid)
        for _ in range(3):
            assert gw.complete() == expected_host
        assert gw.proc.poll() is None and all(alive(pid) for pid in gw.workers())
        assert gw.metric('medusa_gateway_host_weight_bytes{model="h"}') == 0
    finally:
        hold.close()
        log = gw.stop()
    assert "no checked copy of its weight store in the gateway" in log
    assert "cut short while read" in log
