"""weights="host" with a store: the 2-D weights are the pages of a sealed copy of the store
(memory nobody can change), registered once; workers given the gateway's checked copy share its
pages; a restore records and replays that one registration, and a bad store falls back (the graphs
are then captured, said in the log)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from medusa.env import STORE_CHECKED
from medusa.weights import open_store
from medusa.weights.sealed import seal_store
from tests.weights.conftest import (
    CONFIG,
    clean_env,
    copy_with_bad_chunk,
    engine_cmd,
    materialize,
    run_engine,
)

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

HOST = {**CONFIG, "weights": "host"}


@pytest.fixture(scope="module")
def host_artifact(tiny_gguf, tmp_path_factory):
    return materialize(tiny_gguf, tmp_path_factory.mktemp("art") / "host", "--weights", "host")


def _smaps(pid: int, name: str) -> tuple[str, int, int]:
    """(permissions, Rss kB, Pss kB) of the mapping whose path holds `name` in process pid."""
    perms, rss, pss, inside = "", 0, 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = name in line
                if inside:
                    perms = head[1]
            elif inside and head[0] == "Rss:":
                rss += int(head[1])
            elif inside and head[0] == "Pss:":
                pss += int(head[1])
    return perms, rss, pss


def test_two_workers_map_the_checked_copy_and_share_its_pages(tiny_gguf, host_artifact, tmp_path):
    # This process plays the gateway: it holds the sealed, checked copy; its children map it.
    cfg = {**HOST, "model": str(tiny_gguf)}
    store = host_artifact / "weights.store"
    copy = seal_store(open_store(store), check=True)
    env = {**clean_env(), STORE_CHECKED.name: str(copy.fd)}
    procs = [
        subprocess.Popen(engine_cmd(cfg, None, store, "wait"), env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]  # fmt: skip
    try:
        outs = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
        time.sleep(0.2)
        maps = [_smaps(p.pid, "memfd:medusa-store:weights.store") for p in procs]
    finally:
        logs = [p.communicate(timeout=60)[1] for p in procs]
    kb = copy.nbytes // 1024
    copy.close()
    for perms, rss, pss in maps:
        assert perms == "r--s", maps  # read-only and shared: the copy's own pages
        assert rss >= 0.9 * kb, maps  # the device reads them all (here: the CPU)
        assert pss <= 0.6 * rss, maps  # each process is charged a share: they share them
    assert all("the gateway's sealed copy, checked in full" in log for log in logs)
    assert outs[0]["store_error"] is None and outs[0]["logits"] == outs[1]["logits"]
    plain, _ = run_engine(cfg, tmp_path)  # host weights from the model file, one by one
    assert (outs[0]["tokens"], outs[0]["logits"]) == (plain["tokens"], plain["logits"])


def test_a_host_weight_restore_replays_the_one_registration(tiny_gguf, host_artifact, tmp_path):
    cfg = {**HOST, "model": str(tiny_gguf)}
    normal, _ = run_engine(cfg, tmp_path)
    got, _ = run_engine(cfg, tmp_path, host_artifact)
    assert got["restored"] and got["store_error"] is None, got
    assert (got["tokens"], got["logits"]) == (normal["tokens"], normal["logits"])


def test_a_bad_host_store_falls_back_and_the_graphs_are_captured(
    tiny_gguf, host_artifact, tmp_path
):
    copy = copy_with_bad_chunk(host_artifact, tmp_path / "art", offset=7, bit=0x10)
    cfg = {**HOST, "model": str(tiny_gguf)}
    normal, _ = run_engine(cfg, tmp_path)
    got, log = run_engine(cfg, tmp_path, copy)
    assert "chunk 1 of" in got["store_error"]
    assert not got["restored"] and "diverges" in got["restore_error"], got
    assert "recorded with the store will be refused" in log
    assert (got["tokens"], got["logits"]) == (normal["tokens"], normal["logits"])


def test_a_copy_that_is_not_a_checked_one_is_refused_and_the_store_checked(
    tiny_gguf, host_artifact, tmp_path
):
    # A descriptor of the parent that is not a sealed copy checked in full (here: the store file
    # itself, with a bit flipped) vouches for nothing: the worker copies and checks the store.
    cfg = {**HOST, "model": str(tiny_gguf)}
    copy = copy_with_bad_chunk(host_artifact, tmp_path / "art", offset=7, bit=0x10)
    fd = os.open(copy / "weights.store", os.O_RDONLY)
    try:
        got, log = run_engine(cfg, tmp_path, copy, env={STORE_CHECKED.name: str(fd)})
    finally:
        os.close(fd)
    assert "not a sealed copy checked in full" in log
    assert "chunk 1 of" in got["store_error"], got
