"""The artifact on disk: manifest.json + msgpack/zstd payload + saved module images, with a
sha256 per file. It holds data only; loading it never executes anything from it."""

from medusa.artifact.store import (
    SCHEMA_VERSION,
    Artifact,
    ArtifactError,
    load_artifact,
    save_artifact,
    verify_artifact,
)

__all__ = [
    "SCHEMA_VERSION",
    "Artifact",
    "ArtifactError",
    "load_artifact",
    "save_artifact",
    "verify_artifact",
]
