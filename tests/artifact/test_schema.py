"""A manifest of the wrong shape is refused with ArtifactError naming the field, never a
KeyError or TypeError from whatever reads it later (the worker falls back only on the former)."""

from __future__ import annotations

import pytest

from medusa.artifact import ArtifactError, load_artifact
from tests.artifact.conftest import edit_manifest

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def _set(path: str, value: object):
    def fn(m):
        *parents, leaf = path.split(".")
        for p in parents:
            m = m[p]
        m[leaf] = value

    return fn


def _drop(path: str):
    def fn(m):
        *parents, leaf = path.split(".")
        for p in parents:
            m = m[p]
        del m[leaf]

    return fn


CASES = {
    "manifest is a list": (lambda m: [m], "not a JSON object"),
    "kv missing": (_drop("kv"), "missing key 'kv'"),
    "graphs missing": (_drop("graphs"), "missing key 'graphs'"),
    "files is a list": (lambda m: m.update(files=list(m["files"])), "files: expected an object"),
    "kv.num_blocks a string": (_set("kv.num_blocks", "3923"), "kv.num_blocks: expected an integer"),
    "kv.num_blocks negative": (_set("kv.num_blocks", -1), "kv.num_blocks: expected an integer in"),
    "kv.block_bytes a float": (_set("kv.block_bytes", 1.5), "kv.block_bytes: expected an integer"),
    "kv a list": (_set("kv", [1, 2]), "kv: expected an object"),
    "graphs.keys a dict": (_set("graphs.keys", {"4": 1}), "graphs.keys: expected a list"),
    "graphs.count a bool": (_set("graphs.count", True), "graphs.count: expected an integer"),
    "model.identity null": (_set("model.identity", None), "model.identity: expected a string"),
    "device a string": (_set("device", "H100"), "device: expected an object"),
    "device.cc a string": (_set("device.cc", "9.0"), "device.cc: expected a list"),
    "engine a list": (_set("engine", []), "engine: expected an object"),
    "relocations values strings": (
        _set("relocations", {"device": "3201"}),
        "relocations.device: expected an integer",
    ),
    "kernels missing": (_drop("kernels"), "missing key 'kernels'"),
    "kind unknown": (_set("kind", "pickle"), "kind: expected one of"),
    "unknown key": (_set("exec", "rm -rf /"), "unknown key 'exec'"),
    "file entry without sha256": (
        lambda m: m["files"]["plan.msgpack.zst"].__delitem__("sha256"),
        "missing key 'sha256'",
    ),
    "file sha256 not hex": (
        lambda m: m["files"]["plan.msgpack.zst"].update(sha256="Z" * 64),
        "files.plan.msgpack.zst.sha256: expected a string matching",
    ),
    "file size a string": (
        lambda m: m["files"]["plan.msgpack.zst"].update(size="9621"),
        "size: expected an integer",
    ),
    "timings NaN": (_set("baseline_startup.total", float("nan")), "not valid JSON (NaN"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_manifest_is_an_artifact_error_naming_the_field(art, case):
    spoil, message = CASES[case]
    edit_manifest(art, spoil)
    with pytest.raises(ArtifactError, match="manifest.json") as e:
        load_artifact(art)
    assert message in str(e.value)


def test_a_deeply_nested_manifest_is_an_artifact_error(art):
    (art / "manifest.json").write_text(
        '{"schema": 2, "engine": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    with pytest.raises(ArtifactError, match="not valid JSON"):
        load_artifact(art)


def test_the_real_manifest_passes(art):
    assert load_artifact(art).manifest["kv"]["num_blocks"] > 0
