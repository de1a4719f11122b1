"""An artifact holds data, never code: a crafted one cannot run host code in the worker, crash it,
or write into the engine's own memory. Each is refused with the reason and the worker starts the
normal way (with --require-artifact it exits with the reason); `medusa verify` refuses it too."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from medusa.artifact import load_artifact
from medusa.artifact.layout import NODE
from medusa.cuda.toolchain import compile_program
from tests.processes import ENGINE_OPTS, copy_artifact, medusa, reseal, run_restored

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

FALLBACK = """
import json, sys
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
e = LLMEngine(EngineConfig(**json.loads(sys.argv[1])), artifact=sys.argv[2])
text = e.generate(["What is the capital of France?"], SamplingParams(max_tokens=12), chat=True)
print(json.dumps({"restored": e.restored, "error": e.restore_error, "text": text[0]}))
"""
EVIL = """
#include <stdio.h>
__attribute__((constructor)) static void run_at_load(void) {
    FILE *fp = fopen(MARKER, "w");
    if (fp)
        fclose(fp);
}
"""


def _resave(src: Path, dst: Path, edit_plan, images: dict[str, bytes] | None = None) -> Path:
    """A re-sealed copy of the artifact with its plan edited (and images added)."""
    return reseal(copy_artifact(src, dst), edit_plan, images)


def _code_path(image: bytes) -> tuple[int, int]:
    """Where the image's code-object path string starts and how long it is."""
    at = 28 + struct.unpack_from("<I", image, 24)[0]
    return at, struct.unpack_from("<I", image, at)[0]


def _image_naming(image: bytes, path: str) -> bytes:
    at, n = _code_path(image)
    out = bytearray(image[:at] + struct.pack("<I", len(path)) + path.encode() + image[at + 4 + n :])
    struct.pack_into("<Q", out, 16, len(out))
    return bytes(out)


def _with_evil_image(engine_artifact: Path, tmp: Path) -> tuple[Path, Path]:
    """The hidden BLAS kernel's saved image, naming a library whose constructor writes a marker;
    the plan points at it by hash so the restorer finds the kernel nowhere else."""
    marker = tmp / "marker"
    (tmp / "evil.c").write_text(EVIL)
    evil = compile_program(tmp / "evil.c", tmp, libs=(), shared=True,
                           extra=(f'-DMARKER="{marker}"',))  # fmt: skip
    art = load_artifact(engine_artifact)
    (hidden,) = [f for f in art.plan["funcs"] if not f["symbol"]]
    image = _image_naming(art.image(hidden["sha256"]) or b"", str(evil))
    sha = hashlib.sha256(image).hexdigest()

    def point_at_it(plan: dict) -> None:
        for f in plan["funcs"]:
            if f["name"] == hidden["name"]:
                f["sha256"] = sha

    return _resave(engine_artifact, tmp / "art", point_at_it, {sha: image}), marker


def test_an_image_naming_host_code_elsewhere_never_runs_it(engine_artifact, tmp_path):
    art, marker = _with_evil_image(engine_artifact, tmp_path)
    out = run_restored(FALLBACK, tmp_path, str(art), memcheck=False)
    assert not out["restored"] and "Paris" in out["text"]
    load_failed = "its saved image does not load (cuLibraryLoadData: CUDA_ERROR_INVALID_IMAGE (200)"
    assert load_failed in out["error"]
    assert "refused: it is not loaded in this process" in out["error"]
    assert not marker.exists()
    res = medusa("run", *ENGINE_OPTS, "--artifact", str(art), "--require-artifact", "--port", "0")
    assert res.returncode == 3 and "refused: it is not loaded" in res.stderr
    assert not marker.exists()


def _wrap_first_param_off(plan: dict) -> None:
    t = plan["templates"][0]
    nodes = np.frombuffer(t["nodes"], NODE).copy()
    nodes[0]["param_off"], nodes[0]["param_len"] = (1 << 32) - 8, 16  # offset + 8 wraps in 32 bits
    t["nodes"] = nodes.tobytes()


def _contents_into_weights(plan: dict) -> None:
    weights = next(i for i, a in enumerate(plan["allocs"]) if a[0] == "weights_alloc")
    key = next(iter(plan["contents"]))
    plan["contents"][weights] = plan["contents"].pop(key)


def test_a_plan_that_crashed_the_builder_is_refused_and_the_worker_serves(
    engine_artifact, tmp_path
):
    art = _resave(engine_artifact, tmp_path / "art", _wrap_first_param_off)
    out = run_restored(FALLBACK, tmp_path, str(art), memcheck=False)
    assert not out["restored"] and "Paris" in out["text"]
    assert "restore plan: template 0, node 0: param_off/param_len lie outside" in out["error"]
    res = medusa("verify", str(art))
    assert res.returncode != 0 and "param_off/param_len lie outside" in res.stderr


def test_saved_contents_never_go_into_the_engines_weights(engine_artifact, tmp_path):
    art = _resave(engine_artifact, tmp_path / "art", _contents_into_weights)
    out = run_restored(FALLBACK, tmp_path, str(art), memcheck=False)
    assert not out["restored"] and "Paris" in out["text"]
    assert "saved contents may only fill an allocation the restorer replays" in out["error"]
    res = medusa("verify", str(art))
    assert res.returncode != 0 and "saved contents may only fill" in res.stderr


def test_verify_accepts_the_real_artifact(engine_artifact):
    res = medusa("verify", str(engine_artifact))
    assert res.returncode == 0 and ": ok (" in res.stdout
