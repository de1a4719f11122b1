"""Writing, verifying and reading artifacts.

Loading checks, in order, before anything uses the artifact: the manifest's size and JSON, its
schema version, the seal's digest (and signature, given a trusted key), the manifest's schema,
every listed file (a regular file inside the directory, its size and sha256) and the plan's
decoding within the sizes the manifest records."""

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

from medusa import __version__
from medusa.artifact.errors import ArtifactError
from medusa.artifact.files import MANIFEST, SEAL, ArtifactDir
from medusa.artifact.payload import MAX_RAW_SIZE, decode_plan, encode_plan
from medusa.artifact.schema import HEX64, check_manifest
from medusa.artifact.seal import Seal, key_id
from medusa.scratch import ScratchDir

# 4: an engine artifact may carry a weight store (manifest "weights"). 5: the KV cache is
# block-major (its kernels take a block stride), VMM relocations are relative to reservations, and
# an elastic KV cache is described under "kv".
# 6: kv.held_bytes and kv.profile_peak_bytes (the KV size follows the device).
SCHEMA_VERSION = 7  # 7: a tensor-parallel engine's every rank (manifest "tensor_parallel")
PLAN = "plan.msgpack.zst"
MAX_MANIFEST_BYTES = 64 << 20
MAX_SEAL_BYTES = 4096
MAX_ARTIFACT_BYTES = 4 << 30  # all files together: every one is read and hashed at load

__all__ = ["MANIFEST", "PLAN", "SCHEMA_VERSION", "Artifact", "ArtifactError"]


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: dict[str, Any]
    plan: dict[str, Any]
    seal: Seal
    plan_checked: bool = False  # validate_plan passed (a pooled worker checks ahead)

    @property
    def signer(self) -> str | None:
        """The key that signed the artifact (checked only when a trusted key was given)."""
        return key_id(self.seal.public_key) if self.seal.public_key else None

    @property
    def ranks(self) -> int:
        """The tensor-parallel group it was materialized for (1: one device)."""
        tp = self.manifest.get("tensor_parallel")
        return int(tp["size"]) if tp else 1

    def parts(self) -> list[Artifact]:
        """Every rank's artifact (for_rank), in rank order; [self] for one device."""
        return [self.for_rank(r, self.ranks) for r in range(self.ranks)]

    def for_rank(self, rank: int, size: int) -> Artifact:
        """Rank `rank`'s artifact in a tensor-parallel group of `size` (size 1: this one): its
        plan, and its own kv, graphs, relocations and device in the manifest. ArtifactError if
        it was materialized for another group size, or its plans do not match its manifest."""
        if self.ranks != size:
            fix = f"--tensor-parallel-size {size}" if size > 1 else "no --tensor-parallel-size"
            raise ArtifactError(
                f"{self.path}: materialized for {_group(self.ranks)}, this start is "
                f"{_group(size)}; materialize again with {fix}"
            )
        if size == 1:
            return self
        tp, others = self.manifest["tensor_parallel"], self.plan.get("ranks")
        if len(tp["ranks"]) != size or not isinstance(others, list) or len(others) != size - 1:
            raise ArtifactError(
                f"{self.path}: the manifest and the plan do not hold {size} ranks' sections "
                "(corrupted; materialize again)"
            )
        plan = (
            {k: v for k, v in self.plan.items() if k != "ranks"} if rank == 0 else others[rank - 1]
        )
        if not isinstance(plan, dict) or "graphs" not in plan:
            raise ArtifactError(f"{self.path / PLAN}: rank {rank}'s plan is not a restore plan; "
                                "materialize again")  # fmt: skip
        section = tp["ranks"][rank]
        if "weights" in section and section["weights"]["file"] != rank_store(rank):
            raise ArtifactError(f"{self.path}: rank {rank}'s weight store is not "
                                f"{rank_store(rank)} (corrupted; materialize again)")  # fmt: skip
        manifest = {**self.manifest, **section}
        return Artifact(self.path, manifest, plan, self.seal)

    def image(self, sha256: str) -> bytes | None:
        """A saved module image the manifest lists, read again and checked against its sha256;
        None when the artifact saved no image with that hash ("": a kernel of no known image)."""
        if sha256 == "":
            return None
        if not isinstance(sha256, str) or not HEX64.fullmatch(sha256):
            raise ArtifactError(
                f"{self.path / PLAN}: a kernel's image hash {str(sha256)[:80]!r} is not 64 "
                "lowercase hex digits; materialize again"
            )
        name = f"images/{sha256}.img"
        entry = self.manifest["files"].get(name)
        if entry is None:
            return None
        data = ArtifactDir(self.path).read(name, entry["size"])
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ArtifactError(
                f"{self.path / name}: checksum mismatch (corrupted; materialize again)"
            )
        return data


def rank_store(rank: int) -> str:
    """The file a tensor-parallel rank's weight store has in its artifact."""
    return "weights.store" if rank == 0 else f"weights.r{rank}.store"


def _group(size: int) -> str:
    return "one device" if size == 1 else f"a tensor-parallel group of {size}"


def save_artifact(
    out: Path,
    manifest: dict[str, Any],
    plan: dict[str, Any],
    images: dict[str, bytes],
    *,
    sign: str | Path | None = None,
    store: Path | None = None,
    rank_stores: list[Path] | None = None,
) -> Path:
    """Writes the artifact into a fresh directory next to `out`, then swaps it in, so a crash
    never leaves a half-written artifact under the final name. `sign`: a private key file.
    `store`: a weight store (manifest["weights"] describes it), moved in; `rank_stores`: a
    tensor-parallel artifact's ranks 1..N-1's (each rank's section's "weights")."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = ScratchDir(f".{out.name}.", out.parent)  # (a killed materialize's: swept)
    tmp = scratch.path
    try:
        payload, raw_size = encode_plan(plan)
        (tmp / PLAN).write_bytes(payload)
        (tmp / "images").mkdir()
        for sha, data in images.items():
            (tmp / "images" / f"{sha}.img").write_bytes(data)
        files: dict[str, dict[str, Any]] = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                files[str(p.relative_to(tmp))] = {"sha256": _sha256(p), "size": p.stat().st_size}
        files[PLAN]["raw_size"] = raw_size
        if ("weights" in manifest) != (store is not None):
            raise ArtifactError(
                f"{out}: a weight store and the manifest's weights section go together"
            )
        if store is not None:
            shutil.move(store, tmp / manifest["weights"]["file"])  # a rename on one filesystem
        ranks = manifest.get("tensor_parallel", {}).get("ranks", [])[1:]
        named = [r["weights"]["file"] for r in ranks if "weights" in r]
        if len(named) != len(rank_stores or []) or (named and store is None):
            raise ArtifactError(f"{out}: every rank's weight store and its section go together")
        for name, path in zip(named, rank_stores or [], strict=True):
            shutil.move(path, tmp / name)
        full = {"schema": SCHEMA_VERSION, "medusa_version": __version__,
                "created_unix": int(time.time()), **manifest, "files": files}  # fmt: skip
        check_manifest(full, f"the manifest for {out}")
        (tmp / MANIFEST).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
        (tmp / SEAL).write_text(Seal.make(full, sign).to_json())
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        scratch.close()
        raise
    scratch.keep()  # it is `out` now
    return out


def sign_artifact(path: Path, key_file: str | Path) -> Artifact:
    """Signs an existing artifact with a private key file, after checking all of it."""
    art = load_artifact(path)
    seal = Seal.make(art.manifest, key_file)
    # NOTE: a fresh name made with O_EXCL, then a rename: a link planted in the artifact directory
    # (which may be someone else's) is never written through.
    fd, tmp = tempfile.mkstemp(prefix=f".{SEAL}.", dir=path)
    with os.fdopen(fd, "w") as f:
        f.write(seal.to_json())
    os.replace(tmp, Path(path) / SEAL)
    return Artifact(art.path, art.manifest, art.plan, seal)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(path: Path, trust: str | Path | None = None) -> dict[str, Any]:
    """The manifest, its digest (and signature, with `trust`) and schema checked; the files it
    lists are not read."""
    return _read_sealed(ArtifactDir(Path(path)), trust)[0]


def _read_sealed(d: ArtifactDir, trust: str | Path | None) -> tuple[dict[str, Any], Seal]:
    mf = d.path / MANIFEST
    try:
        manifest = json.loads(d.read(MANIFEST, max_size=MAX_MANIFEST_BYTES), parse_constant=_nan)
        if not isinstance(manifest, dict):
            raise ArtifactError(f"{mf}: not a JSON object; materialize again")
        if manifest.get("schema") != SCHEMA_VERSION:
            raise ArtifactError(
                f"{mf}: artifact schema {str(manifest.get('schema'))[:20]}, this medusa reads "
                f"schema {SCHEMA_VERSION}; materialize again with this version"
            )
        seal = Seal.parse(d.read(SEAL, max_size=MAX_SEAL_BYTES), str(d.path / SEAL))
        seal.check(manifest, trust, str(mf))
        check_manifest(manifest, str(mf))
    except ArtifactError:
        raise
    except (ValueError, RecursionError) as e:  # JSON: not JSON, nested too deep, huge numbers
        raise ArtifactError(f"{mf}: not valid JSON ({str(e)[:200]}); materialize again") from None
    return manifest, seal


def _nan(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def load_artifact(path: Path, trust: str | Path | None = None) -> Artifact:
    """The artifact, every check done (see the module's docstring); ArtifactError otherwise.
    `trust`: a public key file; the artifact must then be signed by that key."""
    d = ArtifactDir(Path(path))
    manifest, seal = _read_sealed(d, trust)
    files = manifest["files"]
    if PLAN not in files or "raw_size" not in files[PLAN]:
        raise ArtifactError(
            f"{d.path / MANIFEST}: lists no {PLAN} with its size; materialize again"
        )
    size, raw_size = files[PLAN]["size"], files[PLAN]["raw_size"]
    if size > min(raw_size, MAX_RAW_SIZE) + (raw_size >> 7) + 1024:  # more than zstd ever makes
        raise ArtifactError(
            f"{d.path / PLAN}: {size} bytes cannot be a zstd frame of the {raw_size} bytes the "
            "manifest records; materialize again"
        )
    if sum(f["size"] for f in files.values()) > MAX_ARTIFACT_BYTES:
        raise ArtifactError(
            f"{d.path / MANIFEST}: lists more than {MAX_ARTIFACT_BYTES >> 30} GiB of files; "
            "materialize again"
        )
    data = d.read(PLAN, size)
    if hashlib.sha256(data).hexdigest() != files[PLAN]["sha256"]:
        raise ArtifactError(f"{d.path / PLAN}: checksum mismatch (corrupted; materialize again)")
    for name, want in files.items():
        if name != PLAN and (
            name != f"images/{want['sha256']}.img" or d.sha256(name, want["size"]) != want["sha256"]
        ):
            raise ArtifactError(
                f"{d.path / name}: checksum mismatch (corrupted; materialize again)"
            )
    plan = decode_plan(data, raw_size, str(d.path / PLAN))
    if not isinstance(plan, dict) or "graphs" not in plan:
        raise ArtifactError(f"{d.path / PLAN}: not a restore plan; materialize again")
    return Artifact(d.path, manifest, plan, seal)


def verify_artifact(path: Path, trust: str | Path | None = None) -> Artifact:
    """Every check loading runs, and every chunk of the weight store (`medusa verify`); returns
    the artifact."""
    from medusa.weights import WeightStoreError, open_store

    art = load_artifact(path, trust)
    for w in (a.manifest["weights"] for a in art.parts() if "weights" in a.manifest):
        try:
            with open_store(art.path / w["file"], digest=w["header_sha256"]) as store:
                store.verify()
        except WeightStoreError as e:
            raise ArtifactError(str(e)) from None
    return art
