"""Writing, verifying and reading artifacts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import zstandard

from medusa import __version__

SCHEMA_VERSION = 1
PLAN = "plan.msgpack.zst"
MANIFEST = "manifest.json"


class ArtifactError(ValueError):
    """An artifact that must not be used; the message names the file and what to do."""


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: dict[str, Any]
    plan: dict[str, Any]

    def image(self, sha256: str) -> bytes | None:
        p = self.path / "images" / f"{sha256}.img"
        return p.read_bytes() if p.is_file() else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_artifact(out: Path, manifest: dict[str, Any], plan: dict[str, Any],
                  images: dict[str, bytes]) -> Path:  # fmt: skip
    """Writes the artifact into a fresh directory next to `out`, then swaps it in, so a crash
    never leaves a half-written artifact under the final name."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        payload = msgpack.packb(plan, use_bin_type=True)
        (tmp / PLAN).write_bytes(zstandard.ZstdCompressor(level=6).compress(payload))
        (tmp / "images").mkdir()
        for sha, data in images.items():
            (tmp / "images" / f"{sha}.img").write_bytes(data)
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                files[str(p.relative_to(tmp))] = {"sha256": _sha256(p), "size": p.stat().st_size}
        full = {"schema": SCHEMA_VERSION, "medusa_version": __version__,
                "created_unix": int(time.time()), **manifest, "files": files}  # fmt: skip
        (tmp / MANIFEST).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_manifest(path: Path) -> dict[str, Any]:
    mf = Path(path) / MANIFEST
    if not mf.is_file():
        raise ArtifactError(
            f"{path}: no {MANIFEST}; not an artifact (make one with medusa materialize)"
        )
    try:
        manifest: dict[str, Any] = json.loads(mf.read_text())
    except ValueError as e:
        raise ArtifactError(f"{mf}: not valid JSON ({e}); materialize again") from None
    if manifest.get("schema") != SCHEMA_VERSION:
        raise ArtifactError(
            f"{mf}: artifact schema {manifest.get('schema')}, this medusa reads schema "
            f"{SCHEMA_VERSION}; materialize again with this version"
        )
    return manifest


def verify_artifact(path: Path) -> dict[str, Any]:
    """Checks every file's size and sha256 against the manifest; returns the manifest."""
    path = Path(path)
    manifest = read_manifest(path)
    for rel, want in manifest.get("files", {}).items():
        p = path / rel
        if not p.is_file():
            raise ArtifactError(f"{p}: missing (the artifact is incomplete; materialize again)")
        if p.stat().st_size != want["size"]:
            raise ArtifactError(
                f"{p}: {p.stat().st_size} bytes, the manifest says {want['size']} (truncated or "
                "replaced; materialize again)"
            )
        if _sha256(p) != want["sha256"]:
            raise ArtifactError(f"{p}: checksum mismatch (corrupted; materialize again)")
    if PLAN not in manifest.get("files", {}):
        raise ArtifactError(f"{path}: the manifest lists no {PLAN}")
    return manifest


def load_artifact(path: Path) -> Artifact:
    path = Path(path)
    manifest = verify_artifact(path)
    try:
        raw = zstandard.ZstdDecompressor().decompress((path / PLAN).read_bytes())
        plan = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (zstandard.ZstdError, ValueError, msgpack.UnpackException) as e:
        raise ArtifactError(f"{path / PLAN}: cannot be decoded ({e}); materialize again") from None
    if not isinstance(plan, dict) or "graphs" not in plan:
        raise ArtifactError(f"{path / PLAN}: not a restore plan")
    return Artifact(path, manifest, plan)
