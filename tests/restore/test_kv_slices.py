"""One artifact of a tiny model (materialized on simcuda's default 8 GiB) restored onto devices
of other sizes:
the KV block count a restore derives, with no profiling pass, is what a profiling start chooses on
the same device; a full batch at the longest context is served from it; a device too small for one
sequence is refused naming the sizes; /metrics and the log say how the size came about."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType as T

from medusa.artifact import ArtifactError, load_artifact
from medusa.restore.validate import validate_plan
from medusa.trace import recorder_env
from tests.engine.tiny_models import write_gguf
from tests.processes import CONFIG, ENGINE_OPTS, clean_env, medusa

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

START = """
import json, sys
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
cfg = EngineConfig(**json.loads(sys.argv[1]))
e = LLMEngine(cfg, artifact=sys.argv[2] or None, require_artifact=bool(sys.argv[2]))
out = {"blocks": e.num_kv_blocks, "source": e.kv_size.source, "restored": e.restored,
       "stages": list(e.timings)}
if sys.argv[3]:  # a full batch at the longest context: every sequence to max_model_len
    prompt = cfg.max_num_batched_tokens - 1
    params = SamplingParams(max_tokens=cfg.max_model_len - prompt, ignore_eos=True)
    seqs = [e.add_request([(7 * i + j) % 500 + 10 for j in range(prompt)], params)
            for i in range(cfg.max_num_seqs)]
    while e.has_unfinished():
        e.step()
    out["lengths"] = [len(s.token_ids) for s in seqs]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model's artifact (its weights from the model file), materialized on 8 GiB."""
    tmp = tmp_path_factory.mktemp("tiny")
    write_gguf(tmp / "tiny.gguf", [T.F32])
    res = medusa("materialize", str(tmp / "tiny.gguf"), *ENGINE_OPTS, "--no-weights", "--out",
                 str(tmp / "art"))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "art"


def _env(gib: float, restore_trace=None) -> dict[str, str]:
    env = {**clean_env(), "MEDUSA_SIM_MEMORY": f"{gib:g}G"}
    return recorder_env(restore_trace, mode="restore", base=env) if restore_trace else env


def _start(gib: int, art: Path, tmp: Path, restore: bool, full: bool = False) -> dict:
    env = _env(gib, tmp / "restore-%p.mtr" if restore else None)
    model = load_artifact(art).manifest["engine"]["model"]
    cfg = json.dumps({**CONFIG, "model": model})
    cmd = [sys.executable, "-c", START, cfg, str(art) if restore else "", "full" if full else ""]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_restore_derives_the_block_count_a_profiling_start_chooses(tiny, tmp_path):
    recorded = load_artifact(tiny).manifest["kv"]["num_blocks"]
    counts = {}
    for gib in (4, 8, 12):
        profiled = _start(gib, tiny, tmp_path, restore=False)
        restored = _start(gib, tiny, tmp_path, restore=True, full=gib == 4)
        assert profiled["source"] == "profiled" and "kv_profile" in profiled["stages"]
        assert restored["restored"] and restored["source"] == "derived"
        assert "kv_profile" not in restored["stages"]  # no profiling forward pass
        diff = abs(restored["blocks"] - profiled["blocks"])
        assert diff <= max(1, profiled["blocks"] // 100), (gib, profiled, restored)
        counts[gib] = restored["blocks"]
        if gib == 4:  # the smallest: every sequence of a full batch reaches max_model_len
            assert restored["lengths"] == [CONFIG["max_model_len"]] * CONFIG["max_num_seqs"]
    assert counts[4] < counts[8] < counts[12]
    assert abs(counts[8] - recorded) <= 1  # the device it was materialized on


def test_a_device_too_small_for_one_sequence_is_refused_naming_the_sizes(tiny):
    run = [sys.executable, "-m", "medusa.cli", "run", *ENGINE_OPTS, "--artifact",
           str(tiny), "--port", "0"]  # fmt: skip
    small = _env(16 / 1024)  # 16 MiB: the tiny model's weights and workspace take 9
    required = subprocess.run([*run, "--require-artifact"], env=small, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
    assert required.returncode == 3, required.stderr[-3000:]
    why = "fewer than one sequence of max_model_len=256 needs (16 blocks, 0.50 MiB)"
    assert why in required.stderr and "free of 16 MiB" in required.stderr
    assert "gpu_memory_utilization=0.4 leaves 0 MiB of it" in required.stderr
    assert "raise --gpu-memory-utilization" in required.stderr
    assert "--require-artifact: not starting the normal way" in required.stderr
    # without it, the start falls back like any refusal, and the profiling start finds the same
    fallback = subprocess.run(run, env=small, capture_output=True, text=True, timeout=300)
    assert fallback.returncode == 1
    fell_back = "artifact not used, starting the normal way: restore failed: the KV cache fits"
    assert fell_back in fallback.stderr
    assert "the engine failed to start" in fallback.stderr and why in fallback.stderr


def test_a_smaller_kv_cache_is_checked_against_what_the_graphs_reach(tiny):
    plan = load_artifact(tiny).plan
    kv = next(i for i, a in enumerate(plan["allocs"]) if a[0] == "kv_alloc")
    block = load_artifact(tiny).manifest["kv"]["block_bytes"]
    validate_plan(plan, "art", sizes={kv: block})  # the graphs reach into the first block only
    with pytest.raises(ArtifactError, match="a relocation points outside its allocation"):
        validate_plan(plan, "art", sizes={kv: 8})


def test_the_worker_reports_the_derived_size_in_its_log_and_metrics(tiny, tmp_path):
    port = _free_port()
    cmd = [sys.executable, "-m", "medusa.cli", "run", *ENGINE_OPTS, "--artifact",
           str(tiny), "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=_env(4), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    try:
        metrics = _metrics_when_healthy(proc, f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        log, _ = proc.communicate(timeout=60)
    line = re.search(r"KV cache (\d+) blocks x \d+ bytes = \d+ MiB, derived from the "
                     r"artifact's profiling peak and this device's free memory \(\d+ MiB free "
                     r"of 4096 MiB", log)  # fmt: skip
    assert line, log[-3000:]
    blocks = line.group(1)
    assert f'medusa_kv_cache_blocks{{source="derived"}} {blocks}.0' in metrics
    assert "KV blocks, derived" in log  # the start-up's summary line


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metrics_when_healthy(proc: subprocess.Popen, base: str) -> str:
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return httpx.get(f"{base}/metrics", timeout=10).text
        except httpx.TransportError:
            pass
        assert proc.poll() is None, f"medusa run exited {proc.returncode}"
        time.sleep(0.3)
    raise AssertionError("the worker did not become healthy in 180 s")
