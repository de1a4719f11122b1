"""weights="host" with a store: the 2-D weights are the store's own pages, mapped shared and
registered once, so workers of one model share them; a restore records and replays that one
registration, and a bad store falls back (the graphs are then captured, said in the log)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from medusa.env import STORE_CHECKED
from medusa.weights import open_store
from tests.weights.conftest import (
    CONFIG,
    clean_env,
    copy_with_bad_chunk,
    engine_cmd,
    materialize,
    run_engine,
)

HOST = {**CONFIG, "weights": "host"}


@pytest.fixture(scope="module")
def host_artifact(tiny_gguf, tmp_path_factory):
    return materialize(tiny_gguf, tmp_path_factory.mktemp("art") / "host", "--weights", "host")


def _smaps(pid: int, path: str) -> tuple[str, int, int]:
    """(permissions, Rss kB, Pss kB) of the mapping of `path` in process pid."""
    perms, rss, pss, inside = "", 0, 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = line.rstrip().endswith(path)
                if inside:
                    perms = head[1]
            elif inside and head[0] == "Rss:":
                rss += int(head[1])
            elif inside and head[0] == "Pss:":
                pss += int(head[1])
    return perms, rss, pss


def test_two_workers_map_one_store_and_share_its_pages(tiny_gguf, host_artifact, tmp_path):
    store = host_artifact / "weights.store"
    cfg = {**HOST, "model": str(tiny_gguf)}
    procs = [
        subprocess.Popen(engine_cmd(cfg, None, store, "wait"), env=clean_env(), text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]  # fmt: skip
    try:
        outs = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
        time.sleep(0.2)
        maps = [_smaps(p.pid, str(store)) for p in procs]
    finally:
        for p in procs:
            p.communicate(timeout=60)
    with open_store(store) as s:
        kb = s.nbytes // 1024
    for perms, rss, pss in maps:
        assert perms == "r--s", maps  # read-only and shared: the page cache's own pages
        assert rss >= 0.9 * kb, maps  # every chunk was checked, so every page is in
        assert pss <= 0.6 * rss, maps  # each process is charged about half: they share them
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


def test_a_store_the_gateway_checked_is_not_read_again_unless_the_file_changed(
    tiny_gguf, host_artifact, tmp_path
):
    # The gateway reads and checks a host-weight store in full and holds it mapped, then tells
    # each worker the file's identity: a worker mapping that same unchanged file skips the
    # 70-90 ms pass; a file changed since (here a flipped bit) is checked, and its damage found.
    cfg = {**HOST, "model": str(tiny_gguf)}
    normal, _ = run_engine(cfg, tmp_path)
    with open_store(host_artifact / "weights.store") as s:
        checked = {STORE_CHECKED.name: s.identity}
    got, log = run_engine(cfg, tmp_path, host_artifact, env=checked)
    assert got["restored"] and got["store_error"] is None, got
    assert "checked in full by the gateway" in log
    assert (got["tokens"], got["logits"]) == (normal["tokens"], normal["logits"])

    copy = shutil.copytree(host_artifact, tmp_path / "art")
    with open_store(copy / "weights.store") as s:
        before = {STORE_CHECKED.name: s.identity}  # what the gateway checked ...
    time.sleep(0.05)  # (file times are coarse: a change within a few ms could keep them)
    with open_store(copy / "weights.store") as s:  # ... changed in place since
        at = s.header.data_offset + s.header.chunk_range(1)[0] + 7
    with open(copy / "weights.store", "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))
    got, log = run_engine(cfg, tmp_path, copy, env=before)
    assert "chunk 1 of" in got["store_error"], got
    assert "checked in full by the gateway" not in log
