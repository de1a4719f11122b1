"""One real, signed artifact per session (materializing takes seconds); each test spoils a copy."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from medusa.artifact.seal import Seal
from tests.processes import ENGINE_OPTS, copy_artifact, medusa


@pytest.fixture(scope="session")
def key(tmp_path_factory) -> Path:
    """A private key made by `medusa keygen`; its public key is key.pub beside it."""
    key = tmp_path_factory.mktemp("keys") / "signer"
    res = medusa("keygen", str(key))
    assert res.returncode == 0, res.stderr
    return key


@pytest.fixture(scope="session")
def signed_artifact(tmp_path_factory, key) -> Path:
    out = tmp_path_factory.mktemp("art") / "smollm2"
    res = medusa("materialize", *ENGINE_OPTS, "--out", str(out), "--sign", str(key))
    assert res.returncode == 0, res.stderr
    assert "signed    by ed25519:" in res.stdout
    return out


@pytest.fixture
def art(signed_artifact, tmp_path) -> Path:
    dst = tmp_path / "art"
    return copy_artifact(signed_artifact, dst)


def manifest_of(art: Path) -> dict[str, Any]:
    return json.loads((art / "manifest.json").read_text())


def edit_manifest(art: Path, fn: Callable[[Any], Any], *, reseal: bool = True) -> None:
    """Changes the manifest (fn edits it in place or returns a replacement); with reseal, also
    writes a matching unsigned digest, as anyone who can write the directory can."""
    m = manifest_of(art)
    replaced = fn(m)
    if replaced is not None:
        m = replaced
    (art / "manifest.json").write_text(json.dumps(m))
    if reseal:
        reseal_unsigned(art, m)


def reseal_unsigned(art: Path, manifest: Any) -> None:
    try:
        (art / "seal.json").write_text(Seal.make(manifest).to_json())
    except ValueError:  # NaN: no canonical form; the loader refuses the JSON before the seal
        pass


def replace_plan(art: Path, payload: bytes, raw_size: int | None) -> None:
    """Puts another payload in place of the plan and lists it (sha256, size) in a resealed
    manifest; raw_size None keeps the recorded uncompressed size."""
    (art / "plan.msgpack.zst").write_bytes(payload)

    def fix(m: dict[str, Any]) -> None:
        entry = m["files"]["plan.msgpack.zst"]
        entry.update(sha256=hashlib.sha256(payload).hexdigest(), size=len(payload))
        if raw_size is not None:
            entry["raw_size"] = raw_size

    edit_manifest(art, fix)
