"""Prefill graphs materialized and restored for the tiny Llama and Qwen2 models (memcheck on):
the restored start's tokens, prompts prefilled in chunks longer than a step included, are those
of a normal start (graphs captured) and of eager prefill; `--validate` probed every graph;
`medusa inspect` tells decode graphs from prefill graphs, which share one topology template."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.artifact.seal import Seal
from tests.engine.tiny_models import write_hf, write_qwen2
from tests.processes import clean_env, copy_artifact, reseal, run_restored

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

CONFIG = {
    "max_num_seqs": 4,
    "max_num_batched_tokens": 64,
    "max_model_len": 256,
    "kv_cache_memory": 16 << 20,
    "max_prefill_chunk": 48,
    "prefill_graph_sizes": [16, 32, 64],
}
COMPARE = """
import json, sys
import numpy as np
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
cfg = json.loads(sys.argv[1])
cfg["prefill_graph_sizes"] = tuple(cfg["prefill_graph_sizes"])
rng = np.random.default_rng(1)
prompts = [[int(x) for x in rng.integers(1, 250, n)] for n in (5, 20, 40, 150, 230)]
def tokens(e):
    seqs = [e.add_request(p, SamplingParams(max_tokens=8)) for p in prompts]
    while e.has_unfinished():
        e.step()
    return [s.completion_ids for s in seqs]
restored = LLMEngine(EngineConfig(**cfg), artifact=sys.argv[2], validate=True)
out = {"restored": restored.restored, "error": restored.restore_error,
       "timings": restored.timings, "prefill": sorted(restored.runner.prefill.graphs),
       "decode": sorted(restored.runner.graphs), "restored_tokens": tokens(restored)}
restored.shutdown()
with LLMEngine(EngineConfig(**cfg)) as normal:
    out["normal_tokens"] = tokens(normal)
with LLMEngine(EngineConfig(**{**cfg, "prefill_graph_sizes": ()})) as eager:
    out["eager_tokens"] = tokens(eager)
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_artifact(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    model = tmp / "model"
    if request.param == "llama":
        write_hf(model, {})
    else:
        write_qwen2(model)
    opts = [f"--{k.replace('_', '-')}={','.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in CONFIG.items()]  # fmt: skip
    res = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "materialize", str(model), *opts, "--out",
         str(tmp / "art")],
        env=clean_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return model, tmp / "art", res.stdout


def test_restored_prefill_graphs_give_the_tokens_of_a_normal_start(tiny_artifact, tmp_path):
    model, art, _ = tiny_artifact
    out = run_restored(COMPARE, tmp_path, str(art), config={**CONFIG, "model": str(model)})
    assert out["restored"] and out["error"] is None, out["error"]
    assert out["prefill"] == [16, 32, 64] and out["decode"] == [1, 2, 4]
    assert "validate" in out["timings"]  # every restored graph matched eager execution
    assert out["restored_tokens"] == out["normal_tokens"] == out["eager_tokens"]


def test_inspect_shows_decode_and_prefill_graphs_sharing_a_template(tiny_artifact):
    _, art, materialized = tiny_artifact
    res = subprocess.run([sys.executable, "-m", "medusa.cli", "inspect", str(art)],
                         capture_output=True, text=True, env=clean_env())  # fmt: skip
    assert res.returncode == 0, res.stderr
    for shown in (materialized, res.stdout):
        assert "graphs    6, " in shown and ", 1 topology templates" in shown
        assert "decode  3, batch sizes [4, 2, 1]" in shown
        assert "prefill 3, tokens [64, 32, 16]" in shown
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["engine"]["prefill_graph_sizes"] == [16, 32, 64]


REFUSED = """
import json, sys
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
cfg = json.loads(sys.argv[1])
cfg["prefill_graph_sizes"] = tuple(cfg["prefill_graph_sizes"])
e = LLMEngine(EngineConfig(**cfg), artifact=sys.argv[2], validate=True)
print(json.dumps({"restored": e.restored, "error": e.restore_error,
                  "prefill": sorted(e.runner.prefill.graphs)}))
"""


def _swap_prefill_graphs(plan: dict) -> None:
    """The 32-token graph where the 64-token one was (capture order: 4, 2, 1, 64, 32, 16)."""
    plan["graphs"][3], plan["graphs"][4] = plan["graphs"][4], plan["graphs"][3]


def _drop_setting(art: Path) -> None:
    """The manifest of a medusa that did not record prefill_graph_sizes yet, sealed again."""
    m = json.loads((art / "manifest.json").read_text())
    del m["engine"]["prefill_graph_sizes"]
    (art / "manifest.json").write_text(json.dumps(m))
    (art / "seal.json").write_text(Seal.make(m).to_json())


def _bucket_beyond_the_workspace(art: Path) -> None:
    """A manifest whose largest prefill bucket no workspace holds, sealed again: replaying it
    would copy past the engine's buffers."""
    m = json.loads((art / "manifest.json").read_text())
    m["graphs"]["prefill_keys"][0] = 1 << 20
    (art / "manifest.json").write_text(json.dumps(m))
    (art / "seal.json").write_text(Seal.make(m).to_json())


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda a: reseal(a, _swap_prefill_graphs),
         "validation: the restored prefill graph for tokens 64 gives other outputs than eager"),
        (_drop_setting, "the artifact records no prefill_graph_sizes (materialized by an older"),
        (_bucket_beyond_the_workspace,
         "are not the ones this engine captures (decode [4, 2, 1], prefill [64, 32, 16])"),
    ],
)  # fmt: skip
def test_a_wrong_prefill_graph_or_an_older_artifact_falls_back(tiny_artifact, tmp_path, damage,
                                                               reason):  # fmt: skip
    model, art, _ = tiny_artifact
    damage(copy_artifact(art, tmp_path / "art"))
    config = {**CONFIG, "model": str(model)}
    out = run_restored(REFUSED, tmp_path, str(tmp_path / "art"), config=config)
    assert not out["restored"] and reason in out["error"]
    assert out["prefill"] == [16, 32, 64]  # the normal start captured them
