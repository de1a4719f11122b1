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


def kv_bytes_from(artifact: str | Path, requested: int, free: int) -> int:
    """This device's KV-cache bytes from the artifact; RestoreError when they cannot be used."""
    try:
        section = open_artifact(str(artifact)).manifest["vllm"]
    except (ArtifactError, OSError) as e:
        raise RestoreError(str(e)) from e
    kv, how = kv_bytes_for(section, requested, free)
    log.info("medusa: KV cache %.2f GiB, %s", kv / 2**30, how)
    return kv


def kv_bytes_for(section: dict[str, Any], requested: int, free: int) -> tuple[int, str]:
    """(bytes, how they were found) for a device where vLLM may use `requested` bytes
    (total x --gpu-memory-utilization) and `free` are free. With what profiling measured
    (kv_budget): requested minus the memory the model needs outside the KV cache, vLLM's own rule
    without its profiling forward. An artifact without it: the recorded size, if it is free."""
    recorded = int(section["kv_cache_memory_bytes"])
    budget = section.get("kv_budget")
    if not budget:
        if recorded > free:
            raise RestoreError(
                f"the artifact's KV cache needs {recorded >> 20} MiB, {free >> 20} MiB are free"
            )
        return recorded, "the artifact's recorded size (no profiling peak recorded)"
    non_kv = int(budget["non_kv_bytes"])
    kv = requested - non_kv
    if kv <= 0:
        raise RestoreError(
            f"vLLM may use {requested >> 20} MiB of this device (--gpu-memory-utilization), and "
            f"the model needs {non_kv >> 20} MiB outside the KV cache (measured when it was "
            "materialized): no room is left for a KV cache; use a larger device or raise "
            "--gpu-memory-utilization"
        )
    how = (
        f"derived without profiling: {requested >> 20} MiB requested - {non_kv >> 20} MiB "
        f"outside the KV cache (recorded {recorded >> 20} MiB on a device with "
        f"{int(budget['requested_memory']) >> 20} MiB requested)"
    )
    return kv, how


def install_kv_size(worker_cls: Any, artifact: str) -> None:
    """Before the worker measures memory, set cache_config.kv_cache_memory_bytes from the
    artifact (vLLM's own knob that skips the measurement and the profiling capture): derived for
    this device from what profiling measured, where the artifact recorded it."""
    fn = worker_cls.determine_available_memory
    if getattr(fn, "_medusa_kv", False):
        return

    @functools.wraps(fn)
    def determine_available_memory(self: Any) -> int:
        import torch

        if self.cache_config.kv_cache_memory_bytes is None:
            try:
                free, _ = torch.cuda.mem_get_info()
                requested = int(self.requested_memory)  # set by vLLM's init_device
                self.cache_config.kv_cache_memory_bytes = kv_bytes_from(artifact, requested, free)
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
