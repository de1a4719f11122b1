"""`medusa materialize --engine vllm` and `medusa run --engine vllm` on a machine without a GPU
or without vLLM: what they refuse and what they would run. (No vLLM needed.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.artifact import save_artifact
from medusa.integrations.vllm.materialize import with_kv_size
from medusa.integrations.vllm.schema import vllm_section
from medusa.integrations.vllm.serve import serve_command
from tests.processes import clean_env


def medusa(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "medusa.cli", *args],
        env={**clean_env(), "MEDUSA_DEVICE": "sim"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_kv_size_replaces_one_the_user_gave():
    kv = "--kv-cache-memory-bytes"  # vLLM's flag (EngineArgs.kv_cache_memory_bytes)
    assert with_kv_size(["m", "--max-model-len", "2048"], 5) == [
        "m", "--max-model-len", "2048", kv, "5"
    ]  # fmt: skip
    assert with_kv_size(["m", kv, "9", "--seed", "1"], 5) == ["m", "--seed", "1", kv, "5"]
    assert with_kv_size(["m", "--kv-cache-memory", "9", "--seed", "1"], 5) == [
        "m",
        "--seed",
        "1",
        kv,
        "5",
    ]  # fmt: skip  (the abbreviation vLLM's messages suggest)
    assert with_kv_size(["m", "--kv-cache-memory=9"], 5) == ["m", kv, "5"]
    assert with_kv_size(["m", f"{kv}=9"], 5) == ["m", kv, "5"]


@pytest.mark.e2e
def test_materializing_vllm_without_a_gpu_says_it_needs_one():
    res = medusa("materialize", "--engine", "vllm", "Qwen/Qwen2.5-0.5B-Instruct")
    assert res.returncode == 1
    assert "materializing vLLM needs an NVIDIA GPU" in res.stderr


def _artifact(tmp_path, kind="vllm", **save):
    """A sealed artifact whose manifest is what `medusa run --engine vllm` reads (no plan)."""
    argv = ["/models/qwen", "--max-model-len", "2048", "--kv-cache-memory-bytes", "123"]
    manifest = {
        "kind": kind,
        "model": {"identity": "vllm:0", "name": "qwen"},
        "engine": {"name": "vllm", "argv": argv},
        "device": {},
        "graphs": {"count": 0, "keys": [], "nodes": 0, "templates": 0},
        "relocations": {},
        "kernels": {"count": 0, "exported": 0, "hidden": 0, "images_saved": 0},
    }
    if kind == "vllm":
        manifest["vllm"] = vllm_section(
            version="0.32.0",
            kv_cache_memory_bytes=123,
            cudagraph_mode="FULL_AND_PIECEWISE",
            graphs=[],
            compile_cache=None,
        )
    return save_artifact(tmp_path / "art", manifest, {"graphs": []}, {}, **save)


def test_run_builds_vllm_serve_with_the_recorded_arguments_and_the_restore_env(tmp_path):
    art = _artifact(tmp_path)
    cmd, env = serve_command(str(art), None, ["--seed", "3"], "0.0.0.0", 8001, require=True)
    i = cmd.index("serve")
    assert cmd[i:] == [
        "serve",
        "/models/qwen",
        "--max-model-len",
        "2048",
        "--seed",
        "3",
        "--host",
        "0.0.0.0",
        "--port",
        "8001",
    ]  # fmt: skip  (the KV size comes from the artifact, after a free-memory check)
    assert env["MEDUSA_ARTIFACT"] == str(art.resolve()) and env["MEDUSA_MODE"] == "restore"
    assert env["MEDUSA_TRACE"].endswith("restore-%p.mtr") and env["MEDUSA_REQUIRE_ARTIFACT"] == "1"
    assert "medusa_interpose" in env["LD_PRELOAD"]
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"  # a forked child would not record


@pytest.mark.e2e
def test_run_refuses_an_artifact_of_another_kind_or_model(tmp_path):
    art = _artifact(tmp_path, kind="command")
    res = medusa("run", "--engine", "vllm", "--artifact", str(art))
    assert res.returncode == 1
    assert "is a 'command' artifact; `--engine vllm` needs one made by" in res.stderr
    (art / "manifest.json").write_text("{not json")
    res = medusa("run", "--engine", "vllm", "--artifact", str(art))
    assert "manifest.json: not valid JSON" in res.stderr and "materialize again" in res.stderr
    good = _artifact(tmp_path / "x")
    res = medusa("run", "--engine", "vllm", "--artifact", str(good), "other-model")
    assert "is for model '/models/qwen', not 'other-model'" in res.stderr


@pytest.mark.e2e
def test_run_with_vllm_refuses_the_reference_engines_options():
    res = medusa("run", "--engine", "vllm", "--max-num-seqs", "4", "--artifact", "/x")
    assert res.returncode == 2
    assert "--max-num-seqs: the reference engine's option(s); with --engine vllm" in res.stderr
    res = medusa("materialize", "--engine", "vllm", "M", "--max-model-len", "4096")
    assert res.returncode == 2
    assert "--max-model-len: the reference engine's option(s)" in res.stderr
    assert "medusa materialize --engine vllm MODEL -- --max-model-len 4096" in res.stderr


@pytest.mark.e2e
def test_vllm_arguments_come_only_from_a_manifest_signed_by_the_trusted_key(tmp_path):
    """The recorded arguments reach `vllm serve` (--trust-remote-code, another model): with
    --trust they are used only from an artifact that key signed, and the plugin checks again."""
    key = tmp_path / "k"
    assert medusa("keygen", str(key)).returncode == 0
    signed = _artifact(tmp_path / "s", sign=key)
    cmd, env = serve_command(str(signed), None, [], "127.0.0.1", 8001, False, f"{key}.pub")
    assert "/models/qwen" in cmd and env["MEDUSA_TRUST"] == str(Path(f"{key}.pub").resolve())
    unsigned = _artifact(tmp_path / "u")
    res = medusa("run", "--engine", "vllm", "--artifact", str(unsigned), "--trust", f"{key}.pub")
    assert res.returncode == 1 and "not signed, and --trust" in res.stderr
    manifest = json.loads((signed / "manifest.json").read_text())
    manifest["engine"]["argv"].append("--trust-remote-code")
    (signed / "manifest.json").write_text(json.dumps(manifest))
    res = medusa("run", "--engine", "vllm", "--artifact", str(signed))
    assert res.returncode == 1 and "the manifest's digest is not the one sealed in it" in res.stderr
