"""The engine falls back from any failure of a restore, of whatever type, after releasing what
the restore made; with a trusted key it refuses an unsigned artifact the same way."""

from __future__ import annotations

import json

import pytest

from medusa.artifact.seal import Seal
from tests.artifact.conftest import manifest_of, medusa
from tests.processes import ENGINE_OPTS, run_restored

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

ENGINE = """
import json, sys
from medusa.cuda import load_backend
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.restore import Restorer
if sys.argv[4] == "break":
    def broken(self):
        raise KeyError("globals")  # not a RestoreError: a bug, or a plan nobody checked
    Restorer.map_globals = broken
free0, _ = load_backend().mem_get_info()
cfg = EngineConfig(**json.loads(sys.argv[1]))
e = LLMEngine(cfg, artifact=sys.argv[2], trust=sys.argv[3] or None)
text = e.generate(["What is the capital of France?"], SamplingParams(max_tokens=12), chat=True)
e.shutdown()
free1, _ = load_backend().mem_get_info()
print(json.dumps({"restored": e.restored, "error": e.restore_error, "text": text[0],
                  "leaked": free0 - free1}))
"""


def test_any_exception_in_a_restore_falls_back_and_releases_what_it_made(art, tmp_path):
    out = run_restored(ENGINE, tmp_path, str(art), "", "break", memcheck=False)
    assert not out["restored"]
    assert out["error"] == "restore failed: KeyError('globals')"
    assert "Paris" in out["text"]
    assert out["leaked"] == 0


def test_trust_restores_a_signed_artifact_and_falls_back_from_an_unsigned_one(art, key, tmp_path):
    out = run_restored(ENGINE, tmp_path, str(art), f"{key}.pub", "", memcheck=False)
    assert out["restored"] and out["error"] is None
    (art / "seal.json").write_text(Seal.make(manifest_of(art)).to_json())
    out = run_restored(ENGINE, tmp_path, str(art), f"{key}.pub", "", memcheck=False)
    assert not out["restored"] and "not signed, and --trust" in out["error"]
    assert "Paris" in out["text"]


def test_run_with_trust_and_require_artifact_exits_on_an_unsigned_artifact(art, key):
    (art / "seal.json").write_text(json.dumps({"digest": Seal.make(manifest_of(art)).digest}))
    res = medusa(
        "run", *ENGINE_OPTS, "--artifact", str(art), "--trust", f"{key}.pub",
        "--require-artifact", "--port", "0", timeout=300,
    )  # fmt: skip
    assert res.returncode == 3
    assert "not signed, and --trust" in res.stderr and "--require-artifact" in res.stderr
