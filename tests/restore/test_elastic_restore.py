"""SmolLM2 with elastic KV, materialized, then restored in a fresh process (memcheck on): the
graphs point into the KV reservation, which the restore makes again; pages come from a page
ledger as requests need them, and the tokens are bit for bit those of a normal start.

The artifact's KV is 7.5 GiB of an 8 GiB device, more than is free once the weights are in: a
static cache of that size would be refused, an elastic one starts and maps what it needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from medusa.artifact import load_artifact
from tests.processes import CONFIG, ENGINE_OPTS, clean_env, run_restored

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

KV_BYTES = 15 << 29  # 7.5 GiB: a reservation, not memory
ELASTIC = {**CONFIG, "kv_memory": "elastic", "kv_cache_memory": KV_BYTES}

COMPARE = """
import json, os, sys, tempfile
from medusa import plugins
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.prism.ledger import PageLedger
plugins.register()
cfg = EngineConfig(**json.loads(sys.argv[1]))
ledger = os.path.join(tempfile.mkdtemp(), "ledger")
PageLedger.create(ledger, 64, 2 << 20)
os.environ["MEDUSA_KV_LEDGER"] = ledger
prompts = ["What is the capital of France?", "Name three colours.", "Write a haiku about rain."]
params = SamplingParams(max_tokens=24)
restored = LLMEngine(cfg, artifact=sys.argv[2], validate=True)
free, _ = restored.device.mem_info()
seqs = [restored.add_request(restored.tokenizer.encode(
    restored.tokenizer.apply_chat_template([{"role": "user", "content": p}])), params)
    for p in prompts]
peak = 0
while restored.has_unfinished():
    restored.step()
    peak = max(peak, PageLedger(ledger).capacity - PageLedger(ledger).free())
out = {"restored": restored.restored, "error": restored.restore_error, "free": free,
       "peak_pages": peak, "ledger_free_after": PageLedger(ledger).free(),
       "tokens": [s.completion_ids for s in seqs], "timings": restored.timings}
restored.shutdown()
fresh = LLMEngine(cfg)
fs = [fresh.add_request(s.token_ids[:s.num_prompt_tokens], params) for s in seqs]
while fresh.has_unfinished():
    fresh.step()
out["fresh_tokens"] = [s.completion_ids for s in fs]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def elastic_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "smollm2-elastic"
    opts = ["--kv-memory", "elastic", "--kv-cache-memory", str(KV_BYTES)]
    res = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "materialize", *ENGINE_OPTS, *opts, "--out", str(out)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def test_the_artifact_records_the_reservation(elastic_artifact):
    m = load_artifact(elastic_artifact).manifest
    kv = m["kv"]
    assert kv["memory"] == "elastic" and kv["reserve_bytes"] >= KV_BYTES
    assert kv["page_bytes"] == 2 << 20 and kv["budget_pages"] == kv["reserve_bytes"] >> 21
    assert m["relocations"]["vmm"] > 0  # the graphs' KV pointers: relative to the reservation
    res = subprocess.run([sys.executable, "-m", "medusa.cli", "inspect", str(elastic_artifact)],
                         capture_output=True, text=True, env=clean_env())  # fmt: skip
    assert res.returncode == 0 and "elastic: 7680 MiB reserved" in res.stdout, res.stdout


def test_a_restored_elastic_worker_gives_the_tokens_of_a_normal_start(elastic_artifact, tmp_path):
    out = run_restored(COMPARE, tmp_path, str(elastic_artifact), config=ELASTIC)
    assert out["restored"] and out["error"] is None, out["error"]
    assert "graph_capture" not in out["timings"] and "validate" in out["timings"]
    assert out["free"] < KV_BYTES  # less free than the artifact's KV: elastic, not refused
    assert out["tokens"] == out["fresh_tokens"]
    assert 0 < out["peak_pages"] <= 64 and out["ledger_free_after"] == 64  # idle: all back


def test_another_kv_cache_memory_still_restores_the_recorded_range(elastic_artifact, tmp_path):
    """The graphs point into the range the artifact reserved: a restore keeps it (and says the
    setting is not used) instead of reserving another size and falling back."""
    config = {**ELASTIC, "kv_cache_memory": 2 * KV_BYTES}
    out = run_restored(COMPARE, tmp_path, str(elastic_artifact), config=config)
    assert out["restored"] and out["error"] is None, out["error"]
    assert out["tokens"] == out["fresh_tokens"]
