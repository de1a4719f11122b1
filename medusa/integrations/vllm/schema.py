"""The vLLM part of an artifact's manifest: KV size, graphs keyed by their descriptors, and the
torch.compile cache referenced (not copied) with its hash."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

SECTION_VERSION = 1


def compile_cache_ref(cache_dir: str | Path) -> dict[str, Any]:
    """A reference to vLLM's torch.compile cache: its path and a hash of its files' names, sizes
    and contents, so a restore can tell the cache it needs is the one on disk."""
    root = Path(cache_dir)
    h = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    for p in files:
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return {"dir": str(root), "sha256": h.hexdigest(), "files": len(files)}


def vllm_section(
    *,
    version: str,
    kv_cache_memory_bytes: int,
    cudagraph_mode: str,
    graphs: list[dict[str, Any]],
    compile_cache: dict[str, Any],
) -> dict[str, Any]:
    for i, g in enumerate(graphs):
        if g.get("kind") not in ("full", "piecewise") or "key" not in g or "graph" not in g:
            raise ValueError(f"graphs[{i}]: needs kind (full|piecewise), key and graph index")
    return {
        "version": SECTION_VERSION,
        "vllm_version": version,
        "kv_cache_memory_bytes": int(kv_cache_memory_bytes),
        "cudagraph_mode": cudagraph_mode,
        "graphs": graphs,
        "compile_cache": compile_cache,
    }


def check_section(section: dict[str, Any], *, vllm_version: str) -> None:
    if section.get("version") != SECTION_VERSION:
        raise ValueError(
            f"vLLM section version {section.get('version')}; this medusa reads {SECTION_VERSION}"
        )
    if section.get("vllm_version") != vllm_version:
        raise ValueError(
            f"the artifact was made with vLLM {section.get('vllm_version')}, this is "
            f"{vllm_version}: materialize again"
        )
