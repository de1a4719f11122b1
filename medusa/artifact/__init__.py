"""The artifact on disk: manifest.json + seal.json + msgpack/zstd payload + saved module images,
with a sha256 per file and one digest over them all. It holds data only; loading it never
executes anything from it, nor reads outside its directory."""

from medusa.artifact.errors import ArtifactError
from medusa.artifact.store import (
    SCHEMA_VERSION,
    Artifact,
    load_artifact,
    read_manifest,
    save_artifact,
    sign_artifact,
    verify_artifact,
)

__all__ = [
    "SCHEMA_VERSION",
    "Artifact",
    "ArtifactError",
    "load_artifact",
    "read_manifest",
    "save_artifact",
    "sign_artifact",
    "verify_artifact",
]
