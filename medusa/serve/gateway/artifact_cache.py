"""Artifacts reach the nodes of a Ray cluster: the gateway ships an artifact directory once per
node, and the node keeps it under its cache directory by the artifact's digest.

Small files travel through Ray's object store (put once by the gateway); larger ones (a weight
store) are read in chunks from an `ArtifactSource` actor on the gateway's node, so the object
store never holds a whole weight store. A node verifies the copy (`verify_artifact`: seal, every
file's sha256, every weight-store chunk) and checks that its digest is the one shipped before it
moves the copy into place: a directory in the cache is always a verified artifact."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from medusa import env
from medusa.artifact.errors import ArtifactError
from medusa.artifact.files import MANIFEST, SEAL
from medusa.artifact.seal import manifest_digest
from medusa.artifact.store import read_manifest, verify_artifact

SMALL_FILE = 8 << 20  # bytes: a file up to this size goes through the object store whole
CHUNK = 8 << 20  # bytes per read of a larger file
_NAME = re.compile(
    r"manifest\.json|seal\.json|plan\.msgpack\.zst|images/[0-9a-f]{64}\.img|"
    r"weights(\.r[1-9][0-9]?)?\.store"  # a tensor-parallel rank's too (schema.STORE_NAME)
)


@dataclass(frozen=True)
class ShippedFile:
    name: str
    size: int
    data: Any = None  # an ObjectRef to the bytes; None: read in chunks from the source


@dataclass(frozen=True)
class Shipment:
    digest: str  # the seal's digest: sha256 over the manifest, which lists every file's sha256
    files: tuple[ShippedFile, ...]
    source: Any  # ArtifactSource actor handle
    chunk: int = CHUNK


@ray.remote(num_cpus=0)
class ArtifactSource:
    """Serves chunks of the artifact directories the gateway ships (on the gateway's node)."""

    def __init__(self) -> None:
        self.roots: dict[str, Path] = {}

    def add(self, digest: str, path: str) -> None:
        self.roots[digest] = Path(path)

    def read(self, digest: str, name: str, offset: int, size: int) -> bytes:
        if digest not in self.roots or not _NAME.fullmatch(name):
            raise ValueError(f"no shipped artifact {digest[:12]} with a file {name!r}")
        with open(self.roots[digest] / name, "rb") as f:
            f.seek(offset)
            return f.read(size)


def artifact_files(path: Path) -> tuple[str, list[tuple[str, int]]]:
    """The artifact's digest and the files (name, size) a node needs: the manifest, the seal,
    every file the manifest lists, and the weight store if it has one."""
    manifest = read_manifest(path)  # the seal checked against the manifest
    names = [MANIFEST, SEAL, *sorted(manifest["files"])]
    if manifest.get("weights"):
        names.append(manifest["weights"]["file"])
    return manifest_digest(manifest), [(n, (path / n).stat().st_size) for n in names]


def ship(path: Path, source: Any, small: int = SMALL_FILE, chunk: int = CHUNK) -> Shipment:
    """A shipment of the artifact at `path` (a Ray driver's call): small files put in the object
    store now, larger ones registered with `source` to be read in chunks."""
    digest, files = artifact_files(path)
    ray.get(source.add.remote(digest, str(path)))
    shipped = []
    for name, size in files:
        data = ray.put((path / name).read_bytes()) if size <= small else None
        shipped.append(ShippedFile(name, size, data))
    return Shipment(digest, tuple(shipped), source, chunk)


def cache_root(node_id: str) -> Path:
    """This node's cache: MEDUSA_ARTIFACT_CACHE (or ~/.cache/medusa/artifacts), one directory
    per Ray node (several nodes of a test cluster share a machine)."""
    base = env.ARTIFACT_CACHE.get() or str(Path.home() / ".cache" / "medusa" / "artifacts")
    return Path(base) / f"node-{node_id[:16]}"


class ArtifactCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    async def ensure(self, s: Shipment) -> Path:
        """The verified copy of the shipped artifact on this node, fetched if not cached."""
        final = self.root / s.digest
        if final.is_dir():
            if manifest_digest(read_manifest(final)) != s.digest:
                raise ArtifactError(f"{final}: its digest is not its name; delete it")
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".{s.digest[:12]}-"))
        try:
            for f in s.files:
                await self._fetch(s, f, tmp)
            art = await asyncio.to_thread(verify_artifact, tmp)
            got = manifest_digest(art.manifest)
            if got != s.digest:
                raise ArtifactError(
                    f"the artifact shipped as {s.digest[:12]} arrived with digest {got[:12]}: "
                    "it changed on the gateway's node while shipped; retry"
                )
            try:
                os.rename(tmp, final)
            except OSError:  # another worker on this node cached it first
                if not final.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    async def _fetch(self, s: Shipment, f: ShippedFile, into: Path) -> None:
        if not _NAME.fullmatch(f.name):
            raise ArtifactError(f"shipped artifact {s.digest[:12]}: refusing file name {f.name!r}")
        dest = into / f.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as out:
            if f.data is not None:
                out.write(await f.data)
            else:
                for offset in range(0, f.size, s.chunk):
                    n = min(s.chunk, f.size - offset)
                    out.write(await s.source.read.remote(s.digest, f.name, offset, n))
        if dest.stat().st_size != f.size:
            raise ArtifactError(
                f"shipped artifact {s.digest[:12]}: {f.name} arrived with "
                f"{dest.stat().st_size} bytes, {f.size} were sent; retry"
            )
