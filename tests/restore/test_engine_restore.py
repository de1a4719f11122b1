"""SmolLM2 materialized, then restored in a fresh process at other addresses (memcheck on):
decode and prefill graphs give the outputs freshly captured ones give, and the served text is
the same, a prompt prefilled in chunks included."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from medusa.artifact import SCHEMA_VERSION, load_artifact
from tests.processes import CONFIG, clean_env, run_restored

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

COMPARE = """
import json, sys
import numpy as np
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
cfg = EngineConfig(**json.loads(sys.argv[1]))
prompts = ["What is the capital of France?", "Name three colours.", "Write a haiku about rain.",
           "Summarize this list of animals: " + ", ".join(["cat", "dog", "horse", "owl"] * 25)]
params = SamplingParams(max_tokens=20)
restored = LLMEngine(cfg, artifact=sys.argv[2], validate=True)
def probes(e):
    out = {f"decode {s}": e.runner.probe(s) for s in sorted(e.runner.graphs)}
    pre = e.runner.prefill
    return out | {f"prefill {t}": pre.probe(t) for t in sorted(pre.graphs)}
r_probe = probes(restored)
r_text = restored.generate(prompts, params, chat=True)
long_prompt = len(restored.tokenizer.encode(prompts[-1]))
out = {"restored": restored.restored, "error": restored.restore_error,
       "methods": getattr(restored, "restore_methods", {}), "timings": restored.timings}
restored.shutdown()
fresh = LLMEngine(cfg)
same = {}
for s, (f_tok, f_logits) in probes(fresh).items():
    tok, logits = r_probe[s]
    same[s] = bool(np.array_equal(tok[1], f_tok[1]) and np.array_equal(logits[1], f_logits[1]))
out.update(same=same, text_same=fresh.generate(prompts, params, chat=True) == r_text, text=r_text,
           long_prompt=long_prompt)
print(json.dumps(out))
"""


def test_restored_graphs_and_text_equal_a_fresh_capture(engine_artifact, tmp_path):
    # the last prompt is prefilled in chunks of 96 tokens (buckets 128, then 64 or 128)
    config = {**CONFIG, "max_prefill_chunk": 96}
    out = run_restored(COMPARE, tmp_path, str(engine_artifact), config=config)
    assert out["restored"] and out["error"] is None
    graphs = ["decode 1", "decode 2", "decode 4", "prefill 64", "prefill 128"]
    assert out["same"] == dict.fromkeys(graphs, True)
    assert out["text_same"] and "Paris" in out["text"][0] and out["long_prompt"] > 128
    # exported kernels by their host stubs; the hidden BLAS kernel from the image loaded again
    assert out["methods"] == {"exported stub": 8, "loaded image": 1}
    assert "kv_profile" not in out["timings"] and "graph_capture" not in out["timings"]
    assert "validate" in out["timings"]  # each restored graph matched eager execution


def test_inspect_and_verify_describe_the_artifact(engine_artifact):
    art = load_artifact(engine_artifact)
    assert art.manifest["kv"]["num_blocks"] > 0 and art.manifest["graphs"]["nodes"] > 300
    res = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "inspect", str(engine_artifact)],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert res.returncode == 0
    assert "graphs    5, " in res.stdout and "relocations device" in res.stdout
    assert "decode  3, batch sizes [4, 2, 1]" in res.stdout
    assert "prefill 2, tokens [128, 64]" in res.stdout
    assert "1 hidden" in res.stdout
    assert "profiling peak 0 MiB beyond" in res.stdout  # simcuda: activations in the workspace
    assert "the block count is derived at restore" in res.stdout
    ok = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "verify", str(engine_artifact)],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert ok.returncode == 0 and ": ok (" in ok.stdout
    manifest = json.loads((engine_artifact / "manifest.json").read_text())
    assert manifest["schema"] == SCHEMA_VERSION and set(manifest["files"]) >= {"plan.msgpack.zst"}
