"""Restoring a vLLM start-up: the KV-cache size from the artifact (vLLM then skips profiling
and the profiling capture), and restored graphs standing in for captured ones.

NOTE: the graph objects below launch restored executables on the current CUDA stream; they need a
GPU and have not run on one yet (no GPU was available while writing them)."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("medusa.vllm")


def kv_bytes_from(artifact: str | Path, free_bytes: int) -> int | None:
    """The artifact's KV-cache bytes, or None (with the reason logged) when it does not fit."""
    manifest = json.loads((Path(artifact) / "manifest.json").read_text())
    section = manifest.get("vllm")
    if not section:
        log.warning("medusa: %s has no vLLM section; vLLM profiles as usual", artifact)
        return None
    need = int(section["kv_cache_memory_bytes"])
    if need > free_bytes:
        log.warning(
            "medusa: the artifact's KV cache needs %d MiB, %d MiB are free; vLLM profiles as usual",
            need >> 20,
            free_bytes >> 20,
        )
        return None
    return need


def install_kv_size(worker_cls: type, artifact: str) -> None:
    """Before the worker measures memory, set cache_config.kv_cache_memory_bytes from the
    artifact (vLLM's own knob that skips the measurement and the profiling capture)."""
    fn = worker_cls.determine_available_memory
    if getattr(fn, "_medusa_kv", False):
        return

    @functools.wraps(fn)
    def determine_available_memory(self: Any) -> int:
        import torch

        free, _ = torch.cuda.mem_get_info()
        kv = kv_bytes_from(artifact, free)
        if kv is not None:
            self.cache_config.kv_cache_memory_bytes = kv
        return fn(self)

    determine_available_memory._medusa_kv = True  # type: ignore[attr-defined]
    worker_cls.determine_available_memory = determine_available_memory  # type: ignore[method-assign]


class RestoredGraph:
    """Stands in for a captured torch.cuda.CUDAGraph in CudaGraphManager.graphs: replay() launches
    the restored graph executable on the current stream."""

    def __init__(self, exec_handle: int, backend: Any) -> None:
        self.exec_handle, self.backend = exec_handle, backend

    def replay(self) -> None:
        import torch

        self.backend.graph_launch(self.exec_handle, torch.cuda.current_stream().cuda_stream)
