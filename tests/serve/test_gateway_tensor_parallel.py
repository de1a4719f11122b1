"""A tensor-parallel model in `medusa gateway`: its artifact's group size decides how many slices
its worker takes (one per rank, of one class); the worker restores every rank and answers as one
device does; while the slices are not free its requests get 503 with Retry-After, and all of them
come back when the worker stops."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from medusa.serve.gateway.config import ConfigError, load_config
from medusa.serve.gateway.placement import check_placement
from medusa.serve.gateway.slices import simulated_slices
from tests.engine.tiny_models import write_hf
from tests.processes import child_running, medusa
from tests.serve.test_gateway import _start_gateway, _wait_cold, _wait_gone
from tests.serve.test_pool import _pool

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

SETTINGS = ["--max-num-seqs", "2", "--max-num-batched-tokens", "64", "--max-model-len", "128",
            "--gpu-memory-utilization", "0.3"]  # fmt: skip
ENGINE = (
    "{max_num_seqs: 2, max_num_batched_tokens: 64, max_model_len: 128, gpu_memory_utilization: 0.3}"
)
SLICES = "slices:\n  - {name: s0, memory_gb: 8, sms: 26}\n  - {name: s1, memory_gb: 8, sms: 26}\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama, materialized for two ranks (tp2/)."""
    root = tmp_path_factory.mktemp("gw-tp")
    write_hf(root / "llama", {})
    res = medusa("materialize", str(root / "llama"), "--tensor-parallel-size", "2", *SETTINGS,
                 "--out", str(root / "tp2"))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return root


def _catalog(root: Path, tp: str = "{artifact: tp2, keep_alive: 2}", slices: str = SLICES) -> Path:
    (root / "models.yaml").write_text(
        f"models:\n  tp: {tp}\n"
        f"  one: {{model: {root / 'llama'}, keep_alive: 2, engine: {ENGINE}}}\n{slices}"
    )
    return root / "models.yaml"


def _ask(base: str, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "hello there", "max_tokens": 8, "temperature": 0}
    return httpx.post(f"{base}/v1/completions", json=body, timeout=120)


def _refused_for_room(r: httpx.Response, need: str) -> None:
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
    err = r.json()["error"]
    assert err["code"] == "no_capacity" and err["message"].endswith(f"it needs {need}"), err


def _instances(base: str) -> dict[str, list[dict]]:
    return httpx.get(f"{base}/admin/instances").json()  # type: ignore[no-any-return]


def test_a_tensor_parallel_model_restores_on_two_slices_and_gives_both_back(root):
    proc, base = _start_gateway(str(_catalog(root)))
    try:
        one = _ask(base, "one")  # the model on one device, a normal start: it holds s0
        assert one.status_code == 200, one.text
        _refused_for_room(_ask(base, "tp"), "2 free slices of one class (tensor parallel)")
        _wait_cold(base)  # keep_alive 2 s

        tp = _ask(base, "tp")
        assert tp.status_code == 200, tp.text
        assert tp.json()["choices"][0]["text"] == one.json()["choices"][0]["text"]
        (inst,) = _instances(base)["tp"]
        assert inst["slices"] == ["s0", "s1"] and inst["slice"] == "s0+s1"
        follower = child_running(inst["pid"], b"tensor_parallel")  # rank 1, on its own device
        lines = Path(f"/proc/{follower}/environ").read_text().split("\0")
        env = dict(kv.split("=", 1) for kv in lines if "=" in kv)
        assert env["MEDUSA_SIM_DEVICE_INDEX"] == "1" and env["MEDUSA_SIM_MEMORY"] == "8G"
        stages = httpx.get(f"{base}/metrics").text
        assert 'cold_start_stage_seconds{model="tp",stage="graph_restore"}' in stages
        assert 'model="tp",stage="graph_capture"' not in stages  # every rank restored
        _refused_for_room(_ask(base, "one"), "a free slice")  # both slices are held
        _wait_cold(base)
        assert _wait_gone(follower, 15)  # the ranks stop with the worker

        again = _ask(base, "tp")  # both slices came back
        assert again.status_code == 200 and _instances(base)["tp"][0]["slices"] == ["s0", "s1"]
    finally:
        proc.terminate()
        log = proc.communicate(timeout=60)[0]
    assert "starting tp on slice s0+s1" in log and "tp ready on s0+s1" in log, log


def test_a_pooled_worker_on_one_of_the_slices_is_stopped_for_a_tensor_parallel_model(root):
    (root / "models.yaml").write_text(f"models:\n  tp: {{artifact: tp2}}\nwarm_pool: 1\n{SLICES}")
    proc, base = _start_gateway(str(root / "models.yaml"))
    try:
        (pooled,) = _pool(base, 1)  # the pool's worker holds one of the two slices
        r = _ask(base, "tp")  # a model never waits for the pool: its worker goes
        assert r.status_code == 200, r.text
        assert _instances(base)["tp"][0]["slices"] == ["s0", "s1"]
        assert _wait_gone(pooled["pid"], 15)
    finally:
        proc.terminate()
        log = proc.communicate(timeout=60)[0]
    assert f"stopping the pooled worker on {pooled['slice']} for tp" in log, log


def test_the_catalog_refuses_a_group_size_the_artifact_or_the_slices_cannot_give(root):
    with pytest.raises(ConfigError) as e:
        load_config(_catalog(root, "{artifact: tp2, tensor_parallel_size: 4}"))
    assert str(e.value).endswith(
        f"models.tp.tensor_parallel_size: 4, but the artifact {root / 'tp2'} was materialized for "
        "a tensor-parallel group of 2; drop the field (the artifact decides) or materialize "
        "again with --tensor-parallel-size 4"
    )
    cfg = load_config(_catalog(root))
    assert cfg.models["tp"].tensor_parallel_size == 2
    needs = r"models\.tp: tensor-parallel over 2 ranks, it needs 2 static slices of one class"
    one, unlike = "  - {name: s0, memory_gb: 8}\n", "  - {name: s1, memory_gb: 6}\n"
    for slices in (one, one + unlike):  # one slice; two of different classes
        (root / "slices.yaml").write_text("slices:\n" + slices)
        with pytest.raises(ConfigError, match=needs + r" with about .* GiB each \(one per rank\)"):
            check_placement(cfg, simulated_slices(root / "slices.yaml"))
