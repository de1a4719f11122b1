"""Materialize records through vllm.LLM, the restore runs `vllm serve`: the two must build the
same vLLM configuration, or every restore is refused. Through vLLM's own entry points and parsers
on the CPU, with the device its defaults depend on faked as an 80 GiB H100
(programs/vllm_configs.py). The optional lane (needs vLLM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

pytest.importorskip("vllm.engine.arg_utils")

ROOT = Path(__file__).parents[2]
PROGRAM = Path(__file__).parent / "programs" / "vllm_configs.py"
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm-configs")
    model = work / "tiny-llama"  # a config is all vLLM reads to build its configuration
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    res = subprocess.run(
        [sys.executable, str(PROGRAM), str(work), str(model)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_the_old_path_recorded_another_configuration_than_the_restore_runs(configs):
    old, restored = configs["old_record"], configs["old_restore"]
    assert old["scheduler_config.max_num_batched_tokens"] == 16384  # vllm.LLM on an H100
    assert restored["scheduler_config.max_num_batched_tokens"] == 8192  # vllm serve on it
    assert {k for k in old if old[k] != restored[k]} == {"scheduler_config.max_num_batched_tokens"}


def test_a_recorded_start_up_is_configured_as_its_restore_for_the_default_arguments(configs):
    assert configs["recorded_argv"][1:5] == [
        "--max-num-batched-tokens", "8192", "--max-num-seqs", "1024"
    ]  # fmt: skip
    assert configs["record"] == configs["restore"]
    assert configs["record"] == configs["old_restore"]  # what `vllm serve` picks by itself


def test_the_kv_size_flag_is_the_one_vllms_parser_defines(configs):
    assert configs["recorded_argv"][-2:] == ["--kv-cache-memory-bytes", str(3 << 30)]
    assert configs["kv_flag"] == {
        "parsed": 3 << 30, "defined": True, "dest": "kv_cache_memory_bytes"
    }  # fmt: skip
