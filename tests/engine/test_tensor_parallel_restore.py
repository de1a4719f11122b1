"""A tensor-parallel engine materialized (`medusa materialize --tensor-parallel-size N`: every
rank recorded twice, one artifact holding every rank's plan) and restored, on simcuda: each
rank restores its own graphs, collectives included, and the restored group gives the tokens and
the logits of a normal start, bit for bit, at N = 2 and 4. An artifact for another group size,
or one whose rank plan is damaged, makes every rank start the normal way, with the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from medusa.artifact import ArtifactError, load_artifact
from medusa.engine.loader import open_model
from medusa.engine.loader.stored import check_tensors
from medusa.trace import recorder_env
from medusa.weights import WeightStoreError, open_store
from tests.engine.test_tensor_parallel import run_ranks
from tests.engine.tiny_models import write_hf
from tests.processes import clean_env, reseal

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

# tp_rank.py's engine settings (the artifact's must be the same)
SETTINGS = ["--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--max-model-len", "256",
            "--max-prefill-chunk", "64", "--gpu-memory-utilization", "0.3"]  # fmt: skip


def medusa(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "medusa.cli", *args], capture_output=True,
                          text=True, env=clean_env(), timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-restore")
    write_hf(root / "llama", {})
    arts = {}
    for n in (2, 4):
        res = medusa("materialize", str(root / "llama"), "--tensor-parallel-size", str(n),
                     *SETTINGS, "--out", str(root / f"tp{n}"))  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"recorded run 2 of 2, {n} ranks" in res.stderr
        assert f"tensor parallel {n} ranks" in res.stdout  # medusa inspect's line
        arts[n] = root / f"tp{n}"
    return root / "llama", arts


def restored(model: Path, n: int, out: Path, art: Path, *flags: str) -> list[dict]:
    env = recorder_env(out.parent / f"{out.name}-%p.mtr", mode="restore", base=clean_env())
    return run_ranks(str(model), n, out, f"artifact={art}", *flags, env=env)


@pytest.mark.parametrize("n", [2, 4])
def test_restored_ranks_equal_a_normal_start_bit_for_bit(llama, n, tmp_path):
    model, arts = llama
    normal = run_ranks(str(model), n, tmp_path / "normal")
    back = restored(model, n, tmp_path / "restored", arts[n], "validate")
    for r, (a, b) in enumerate(zip(normal, back, strict=True)):
        assert b["restored"] and b["restore_error"] is None, f"rank {r}: {b['restore_error']}"
        assert "graph_capture" not in b["timings"] and "kv_profile" not in b["timings"]
        assert b["store"] and b["store_error"] is None, f"rank {r}: {b['store_error']}"
        assert b["tokens"] == a["tokens"] and b["blocks"] == a["blocks"]
        assert np.array_equal(b["logits"], a["logits"]), f"rank {r}: logits differ"


def test_a_bad_chunk_in_one_rank_s_store_loads_its_shard_from_the_model_file(llama, tmp_path):
    model, arts = llama
    art = tmp_path / "art"
    subprocess.run(["cp", "-r", str(arts[2]), str(art)], check=True)
    store = art / "weights.r1.store"
    with store.open("r+b") as f:  # a byte of the last chunk's data (the header holds its hash)
        f.seek(store.stat().st_size - 5)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    good = medusa("verify", str(arts[2]))  # every rank's plan, and store chunk by chunk
    assert good.returncode == 0 and "2 weight stores: " in good.stdout, good.stderr
    bad = medusa("verify", str(art))
    assert bad.returncode != 0 and "weights.r1.store" in bad.stderr
    normal = run_ranks(str(model), 2, tmp_path / "normal")
    ranks = restored(model, 2, tmp_path / "r", art)
    assert [r["restored"] for r in ranks] == [True, True]  # the store is not the plan
    assert ranks[0]["store"] and not ranks[1]["store"]
    assert "weights.r1.store" in ranks[1]["store_error"] and "chunk" in ranks[1]["store_error"]
    assert [r["tokens"] for r in ranks] == [r["tokens"] for r in normal]
    assert np.array_equal(ranks[1]["logits"], normal[1]["logits"])  # its shard, from the file


def test_a_rank_s_store_holds_its_shard_and_is_refused_elsewhere(llama):
    model, arts = llama
    src = open_model(str(model))
    with open_store(arts[2] / "weights.r1.store") as store:
        check_tensors(store, src.spec, (1, 2))
        with pytest.raises(WeightStoreError, match="holds rank 1 of 2's shard, this start needs "
                           "rank 0 of 2's shard"):  # fmt: skip
            check_tensors(store, src.spec, (0, 2))
        with pytest.raises(WeightStoreError, match="this start needs the whole model"):
            check_tensors(store, src.spec)


def test_another_group_size_starts_every_rank_the_normal_way(llama, tmp_path):
    model, arts = llama
    normal = run_ranks(str(model), 4, tmp_path / "normal")
    ranks = restored(model, 4, tmp_path / "r", arts[2])
    for a, b in zip(normal, ranks, strict=True):
        assert not b["restored"] and b["tokens"] == a["tokens"]
        assert (
            "materialized for a tensor-parallel group of 2, this start is a tensor-parallel "
            "group of 4; materialize again with --tensor-parallel-size 4" in b["restore_error"]
        )
    one = restored(model, 1, tmp_path / "one", arts[2])[0]  # one device: refused too
    assert not one["restored"] and "this start is one device" in one["restore_error"]


@pytest.mark.parametrize(
    "damage, own",
    [
        # found while restoring rank 1's graphs (after the collectives' first step)
        (lambda p: p["ranks"][0]["funcs"][0].update(name="missing_kernel", symbol="", sha256=""),
         "kernel missing_kernel (image ) cannot be found"),
        # found checking rank 1's plan, before anything is allocated
        (lambda p: p["ranks"][0]["graphs"].append(7), "restore plan: graphs[4]"),
    ],
    ids=["kernel", "plan"],
)  # fmt: skip
def test_one_damaged_rank_plan_starts_every_rank_the_normal_way(llama, tmp_path, damage, own):
    model, arts = llama
    art = tmp_path / "art"
    subprocess.run(["cp", "-r", str(arts[2]), str(art)], check=True)
    reseal(art, damage)
    normal = run_ranks(str(model), 2, tmp_path / "normal")
    ranks = restored(model, 2, tmp_path / "r", art)
    assert [r["restored"] for r in ranks] == [False, False]
    assert "tensor-parallel rank 1 of 2 could not restore" in ranks[0]["restore_error"]
    assert own in ranks[1]["restore_error"]
    assert [r["tokens"] for r in ranks] == [r["tokens"] for r in normal]


def test_an_artifact_whose_sections_do_not_match_its_group_is_refused(llama):
    _, arts = llama
    art = load_artifact(arts[2])
    assert art.ranks == 2 and art.for_rank(1, 2).manifest["kv"]["num_blocks"] > 0
    short = type(art)(art.path, art.manifest, {**art.plan, "ranks": []}, art.seal)
    with pytest.raises(ArtifactError, match="do not hold 2 ranks' sections"):
        short.for_rank(1, 2)
    with pytest.raises(ArtifactError, match="materialize again with --tensor-parallel-size 4"):
        art.for_rank(0, 4)


def test_the_commands_refuse_a_group_size_they_cannot_use(llama, tmp_path):
    model, arts = llama
    res = medusa("run", "--artifact", str(arts[2]), "--tensor-parallel-size", "4", "--demo", "x")
    assert res.returncode == 2
    assert "materialized for a tensor-parallel group of 2; drop the flag (or pass 2)" in res.stderr
    res = medusa("materialize", str(model), "--tensor-parallel-size", "2", "--check-accesses",
                 "warn", "--out", str(tmp_path / "x"))  # fmt: skip
    assert res.returncode == 2 and "--check-accesses records one device" in res.stderr
    res = medusa("materialize", "--tensor-parallel-size", "2", "--command", "--", "true")
    assert res.returncode == 2 and "drop it with --command" in res.stderr
