"""Property: whatever is done to a real artifact's manifest or payload (types, missing keys, path
strings, sizes, bytes), loading it either succeeds or raises ArtifactError, within bounded
memory. Mutations are resealed (an unsigned digest anyone can write) so they reach the checks."""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medusa.artifact import ArtifactError, load_artifact
from medusa.artifact.seal import Seal
from tests.processes import copy_artifact

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PEAK_LIMIT = 64 << 20
SETTINGS = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
PATHS = st.sampled_from(
    ["../../etc/passwd", "/etc/passwd", "images/../plan.msgpack.zst", "images/" + "a" * 64,
     "plan.msgpack.zst", "images/" + "0" * 64 + ".img", "", ".", "images", "manifest.json"]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    PATHS,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(m: Any, path: tuple, op: str, value: Any) -> Any:
    if not path:
        return value if op == "set" else m
    parent = m
    for p in path[:-1]:
        parent = parent[p]
    leaf = path[-1]
    if op == "set":
        parent[leaf] = value
    elif op == "delete":
        del parent[leaf]
    elif op == "rename" and isinstance(parent, dict):
        parent[value if isinstance(value, str) else str(value)] = parent.pop(leaf)
    return m


class Workspace:
    """A copy of the real artifact reset before each example."""

    def __init__(self, src: Path) -> None:
        top = Path(tempfile.mkdtemp(prefix="medusa-fuzz-"))
        atexit.register(shutil.rmtree, top, True)
        self.dir = copy_artifact(src, top / "art")
        self.manifest = json.loads((src / "manifest.json").read_text())
        self.plan = (src / "plan.msgpack.zst").read_bytes()
        self.raw = zstandard.ZstdDecompressor().decompress(self.plan)

    def load(self, manifest: Any, plan: bytes) -> None:
        (self.dir / "plan.msgpack.zst").write_bytes(plan)
        (self.dir / "manifest.json").write_text(json.dumps(manifest))
        (self.dir / "seal.json").write_text(Seal.make(manifest).to_json())
        tracemalloc.start()
        try:
            load_artifact(self.dir)
        except ArtifactError:
            pass
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert peak < PEAK_LIMIT, f"{peak >> 20} MiB"


_WS: dict[Path, Workspace] = {}


def _ws(src: Path) -> Workspace:
    if src not in _WS:
        _WS[src] = Workspace(src)
    return _WS[src]


def test_fuzz_manifest(signed_artifact):
    ws = _ws(signed_artifact)
    paths = _paths(ws.manifest)

    @SETTINGS
    @given(
        st.lists(
            st.tuples(st.sampled_from(paths), st.sampled_from(["set", "delete", "rename"]), VALUES),
            min_size=1,
            max_size=3,
        )
    )
    def run(edits):
        m = json.loads(json.dumps(ws.manifest))
        for path, op, value in edits:
            try:
                m = _mutate(m, path, op, value)
            except (KeyError, IndexError, TypeError):
                continue  # an earlier edit removed or replaced the path
        ws.load(m, ws.plan)

    run()


def test_fuzz_payload(signed_artifact):
    ws = _ws(signed_artifact)

    @SETTINGS
    @given(
        st.lists(
            st.tuples(st.integers(0, len(ws.raw) - 1), st.integers(0, 255)), min_size=1, max_size=8
        ),
        st.sampled_from(["raw", "compressed", "truncate"]),
        st.one_of(st.none(), st.integers(0, 2**40)),
    )
    def run(flips, where, raw_size):
        m = json.loads(json.dumps(ws.manifest))
        entry = m["files"]["plan.msgpack.zst"]
        if where == "raw":
            raw = bytearray(ws.raw)
            for i, b in flips:
                raw[i] = b
            plan = zstandard.ZstdCompressor(level=1).compress(bytes(raw))
            entry["raw_size"] = len(raw)
        elif where == "compressed":
            data = bytearray(ws.plan)
            for i, b in flips:
                data[i % len(data)] = b
            plan = bytes(data)
        else:
            plan = ws.plan[: flips[0][0] % len(ws.plan)]
        if raw_size is not None:
            entry["raw_size"] = raw_size
        entry.update(sha256=hashlib.sha256(plan).hexdigest(), size=len(plan))
        ws.load(m, plan)

    run()
