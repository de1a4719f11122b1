"""The KV cache's size from a vLLM artifact, set inside vLLM's worker before it measures memory
(cache_config.kv_cache_memory_bytes: vLLM's own knob that skips the measurement and the
profiling capture); and the artifact, opened once per process."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from medusa import env
from medusa.artifact import Artifact, ArtifactError, load_artifact
from medusa.restore.errors import RestoreError

log = logging.getLogger("medusa.vllm")


@functools.cache
def open_artifact(path: str) -> Artifact:
    """The artifact, verified once per process (every file's size and hash)."""
    art = load_artifact(Path(path), trust=env.TRUST.get() or None)
    if art.manifest.get("kind") != "vllm" or "vllm" not in art.manifest:
        raise ArtifactError(
            f"{path} is a {art.manifest.get('kind')!r} artifact, not a vLLM one: "
            "make it with `medusa materialize --engine vllm`"
        )
    return art


def kv_bytes_from(artifact: str | Path, free_bytes: int) -> int:
    """The artifact's KV-cache bytes; RestoreError when they cannot be used here."""
    try:
        need = int(open_artifact(str(artifact)).manifest["vllm"]["kv_cache_memory_bytes"])
    except (ArtifactError, OSError) as e:
        raise RestoreError(str(e)) from e
    if need > free_bytes:
        raise RestoreError(
            f"the artifact's KV cache needs {need >> 20} MiB, {free_bytes >> 20} MiB are free"
        )
    return need


def install_kv_size(worker_cls: Any, artifact: str) -> None:
    """Before the worker measures memory, set cache_config.kv_cache_memory_bytes from the
    artifact (vLLM's own knob that skips the measurement and the profiling capture)."""
    fn = worker_cls.determine_available_memory
    if getattr(fn, "_medusa_kv", False):
        return

    @functools.wraps(fn)
    def determine_available_memory(self: Any) -> int:
        import torch

        if self.cache_config.kv_cache_memory_bytes is None:
            try:
                free, _ = torch.cuda.mem_get_info()
                self.cache_config.kv_cache_memory_bytes = kv_bytes_from(artifact, free)
            # NOTE: any failure (as in restore.py's capture_model): vLLM profiles as usual, and the
            # graph restore then refuses the KV size that differs.
            except Exception as e:
                if env.REQUIRE_ARTIFACT.get():
                    raise
                log.warning("medusa: artifact not used, vLLM profiles as usual: %s", reason(e))
        return fn(self)

    determine_available_memory._medusa_kv = True  # type: ignore[attr-defined]
    worker_cls.determine_available_memory = determine_available_memory


def reason(e: Exception) -> str:
    return str(e) if isinstance(e, RestoreError) else f"{type(e).__name__}: {e}"
