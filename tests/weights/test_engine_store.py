"""A restored start with the weight store: the same outputs as a normal start, for GGUF and HF
models, without parsing the model file; a corrupt or missing store falls back to the model file
with the reason (the chunk named), and the engine still answers correctly."""

from __future__ import annotations

import shutil

import pytest

from tests.weights.conftest import CONFIG, copy_with_bad_chunk, materialize, medusa, run_engine

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=["gguf", "hf"])
def model_and_artifact(request, tmp_path_factory):
    model = request.getfixturevalue(f"tiny_{request.param}")
    return model, materialize(model, tmp_path_factory.mktemp("art") / request.param)


def test_restored_start_with_the_store_gives_the_logits_of_a_normal_start(
    model_and_artifact, tmp_path
):
    model, art = model_and_artifact
    cfg = {**CONFIG, "model": str(model)}
    normal, _ = run_engine(cfg, tmp_path)
    restored, _ = run_engine(cfg, tmp_path, art)
    assert restored["restored"] and restored["store_error"] is None, restored
    assert restored["source"] == "StoredModel"  # spec and tokenizer from the store
    assert (restored["tokens"], restored["logits"]) == (normal["tokens"], normal["logits"])


def test_a_corrupt_chunk_is_found_while_loading_and_the_model_file_is_used(
    model_and_artifact, tmp_path
):
    model, art = model_and_artifact
    copy = copy_with_bad_chunk(art, tmp_path / "art", offset=100, bit=0x01)
    cfg = {**CONFIG, "model": str(model)}
    normal, _ = run_engine(cfg, tmp_path)
    got, log = run_engine(cfg, tmp_path, copy)
    assert "chunk 1 of" in got["store_error"] and "corrupted" in got["store_error"]
    assert "weight store not used" in log and "chunk 1 of" in log
    # Device-resident weights reload into the same buffers: the graphs still restore.
    assert got["restored"], got["restore_error"]
    assert (got["tokens"], got["logits"]) == (normal["tokens"], normal["logits"])


def test_a_missing_store_falls_back_with_the_reason(model_and_artifact, tmp_path):
    model, art = model_and_artifact
    copy = shutil.copytree(art, tmp_path / "art", ignore=shutil.ignore_patterns("weights.store"))
    cfg = {**CONFIG, "model": str(model)}
    normal, _ = run_engine(cfg, tmp_path)
    got, _ = run_engine(cfg, tmp_path, copy)
    assert "weights.store: missing" in got["store_error"]
    assert got["restored"] and got["source"] != "StoredModel"
    assert (got["tokens"], got["logits"]) == (normal["tokens"], normal["logits"])


def test_medusa_verify_checks_every_chunk_and_inspect_shows_the_store(model_and_artifact, tmp_path):
    _, art = model_and_artifact
    ok = medusa("verify", str(art))
    assert ok.returncode == 0 and "weight store: 2 chunks checked" in ok.stdout, ok.stderr
    assert "weights   weights.store:" in medusa("inspect", str(art)).stdout
    copy = shutil.copytree(art, tmp_path / "art")
    raw = bytearray((copy / "weights.store").read_bytes())
    raw[-1] ^= 0xFF
    (copy / "weights.store").write_bytes(raw)
    bad = medusa("verify", str(copy))
    assert bad.returncode != 0 and "chunk 1 of 2" in bad.stderr
