"""Every way an artifact can be unusable is refused with the reason, and the worker starts the
normal way (or, with --require-artifact, exits with the reason)."""

from __future__ import annotations

import json

import pytest

from medusa.artifact import SCHEMA_VERSION
from medusa.artifact.seal import Seal
from tests.processes import ENGINE_OPTS, copy_artifact, medusa, reseal, run_restored

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

FALLBACK = """
import json, sys
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
cfg = EngineConfig(**{**json.loads(sys.argv[1]), **json.loads(sys.argv[3])})
e = LLMEngine(cfg, artifact=sys.argv[2])
text = e.generate(["What is the capital of France?"], SamplingParams(max_tokens=12), chat=True)
print(json.dumps({"restored": e.restored, "error": e.restore_error, "text": text[0],
                  "stages": list(e.timings)}))
"""


def _copy(src, tmp):
    return copy_artifact(src, tmp / "art")


def _edit_manifest(art, fn):
    """Edits the manifest and writes a matching (unsigned) digest: what a writer of the directory
    can do; the refusal must then come from the check of what was changed."""
    m = json.loads((art / "manifest.json").read_text())
    fn(m)
    (art / "manifest.json").write_text(json.dumps(m))
    (art / "seal.json").write_text(Seal.make(m).to_json())


def _resave(art, fn):
    reseal(art, fn)


def _first_engine_alloc(plan):
    return next(i for i, a in enumerate(plan["allocs"]) if a[0] == "workspace")


CASES = {
    "device": (
        lambda a: _edit_manifest(a, lambda m: m["device"].update(name="NVIDIA H200")),
        {},
        "device mismatch: name is",
    ),
    "model": (
        lambda a: _edit_manifest(a, lambda m: m["model"].update(identity="gguf:0000")),
        {},
        "model mismatch",
    ),
    "config": (
        lambda a: None,
        {"max_num_seqs": 2},
        "engine configuration mismatch: max_num_seqs=2 here, 4 when materialized",
    ),
    "schema": (  # an older artifact: it records no profiling peak to derive the KV size from
        lambda a: _edit_manifest(a, lambda m: m.update(schema=SCHEMA_VERSION - 1)),
        {},
        f"artifact schema {SCHEMA_VERSION - 1}, this medusa reads schema {SCHEMA_VERSION}; "
        "materialize again",
    ),
    "checksum": (lambda a: _flip_image_byte(a), {}, "checksum mismatch"),
    "truncated": (lambda a: _truncate(a / "plan.msgpack.zst"), {}, "truncated or replaced"),
    "allocation": (
        lambda a: _resave(
            a,
            lambda p: p["allocs"][_first_engine_alloc(p)].__setitem__(
                3, p["allocs"][_first_engine_alloc(p)][3] + 256
            ),
        ),
        {},
        "the start-up diverges",
    ),
    "kernel": (
        lambda a: _resave(
            a, lambda p: p["funcs"][0].update(name="missing_kernel", symbol="", sha256="")
        ),
        {},
        "kernel missing_kernel (image ) cannot be found",
    ),
}


def _flip_image_byte(art):
    img = next((art / "images").iterdir())
    data = bytearray(img.read_bytes())
    data[-1] ^= 0xFF
    img.write_bytes(bytes(data))


def _truncate(p):
    p.write_bytes(p.read_bytes()[:-10])


@pytest.mark.parametrize("case", list(CASES))
def test_an_unusable_artifact_is_refused_and_the_worker_starts_normally(
    engine_artifact, tmp_path, case
):
    spoil, overrides, message = CASES[case]
    art = _copy(engine_artifact, tmp_path)
    spoil(art)
    out = run_restored(FALLBACK, tmp_path, str(art), json.dumps(overrides), memcheck=False)
    assert not out["restored"]
    assert message in out["error"]
    assert "Paris" in out["text"]
    assert "kv_profile" in out["stages"] and "graph_capture" in out["stages"]


def test_require_artifact_exits_with_the_reason(engine_artifact, tmp_path):
    art = _copy(engine_artifact, tmp_path)
    CASES["device"][0](art)
    res = medusa("run", *ENGINE_OPTS, "--artifact", str(art), "--require-artifact", "--port", "0")
    assert res.returncode == 3
    assert "device mismatch: name is" in res.stderr and "--require-artifact" in res.stderr


KV_HELD = """
import json, sys
from medusa.cuda import load_backend
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.restore import RestoreError
load_backend().malloc(int(sys.argv[3]) << 20)  # another tenant holds memory of the device
try:
    e = LLMEngine(EngineConfig(**json.loads(sys.argv[1])), artifact=sys.argv[2],
                  require_artifact=True)
    print(json.dumps({"error": None, "blocks": e.num_kv_blocks, "source": e.kv_size.source,
                      "restored": e.restored}))
except RestoreError as e:
    print(json.dumps({"error": str(e)}))
"""


def test_memory_another_tenant_holds_shrinks_the_restored_kv_cache(engine_artifact, tmp_path):
    recorded = json.loads((engine_artifact / "manifest.json").read_text())["kv"]["num_blocks"]
    out = run_restored(KV_HELD, tmp_path, str(engine_artifact), "1024", memcheck=False)
    assert out["restored"] and out["source"] == "derived"
    assert abs(recorded - out["blocks"] - (1 << 30) // 737280) <= 1  # 1 GiB fewer


def test_a_kv_cache_that_no_longer_fits_is_refused_naming_the_sizes(engine_artifact, tmp_path):
    out = run_restored(KV_HELD, tmp_path, str(engine_artifact), str(5 << 10), memcheck=False)
    assert "fewer than one sequence of max_model_len=256 needs (16 blocks, 11 MiB)" in out["error"]
    assert "MiB free of 8192 MiB, gpu_memory_utilization=0.4 leaves 0 MiB" in out["error"]


@pytest.mark.parametrize(
    ("key", "value"), [("max_num_seqs", "x"), ("max_num_seqs", -3), ("capture_sizes", [1, "a"])]
)
def test_engine_settings_a_writer_spoiled_are_refused_not_raised(
    engine_artifact, tmp_path, key, value
):
    """The manifest's engine settings are what `run --artifact` takes: one of another type or out
    of range (its digest rewritten to match) is named by inspect and refused by run, with no
    traceback."""
    art = _copy(engine_artifact, tmp_path)
    _edit_manifest(art, lambda m: m["engine"].__setitem__(key, value))
    shown = medusa("inspect", str(art))
    assert shown.returncode == 0, shown.stderr
    assert "runs with nothing: its recorded engine settings are not valid" in shown.stdout
    res = medusa("run", *ENGINE_OPTS, "--artifact", str(art), "--require-artifact", "--port", "0")
    assert res.returncode == 3 and "Traceback" not in res.stderr
    assert f"engine configuration mismatch: {key}=" in res.stderr
