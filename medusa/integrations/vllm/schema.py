"""The vLLM part of an artifact's manifest: KV size, graphs keyed by their descriptors, and the
torch.compile cache referenced (not copied) with its hash."""

from __future__ import annotations

import enum
import hashlib
from pathlib import Path
from typing import Any

SECTION_VERSION = 3  # 3: kv_budget (the KV size follows the device)


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


# (section, attribute) of VllmConfig that change what start-up allocates, compiles or captures.
CONFIG_FIELDS = (
    ("model_config", "model"),
    ("model_config", "revision"),
    ("model_config", "dtype"),
    ("model_config", "max_model_len"),
    ("model_config", "quantization"),
    ("model_config", "enforce_eager"),
    ("cache_config", "block_size"),
    ("cache_config", "cache_dtype"),
    ("scheduler_config", "max_num_seqs"),
    ("scheduler_config", "max_num_batched_tokens"),
    ("parallel_config", "tensor_parallel_size"),
    ("parallel_config", "pipeline_parallel_size"),
    ("compilation_config", "mode"),
    ("compilation_config", "backend"),
    ("compilation_config", "cudagraph_mode"),
    ("compilation_config", "cudagraph_capture_sizes"),
)


def _plain(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.name
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return getattr(v, "name", None) or str(v)  # enums by name, dtypes by str


def config_fingerprint(vllm_config: Any) -> dict[str, Any]:
    """The settings an artifact must be restored under, as plain values."""
    out = {}
    for section, attr in CONFIG_FIELDS:
        out[f"{section}.{attr}"] = _plain(getattr(getattr(vllm_config, section, None), attr, None))
    out["use_v2_model_runner"] = bool(getattr(vllm_config, "use_v2_model_runner", False))
    return out


def vllm_section(
    *,
    version: str,
    kv_cache_memory_bytes: int,
    cudagraph_mode: str,
    kv_budget: dict[str, Any] | None = None,
    graphs: list[dict[str, Any]],
    compile_cache: dict[str, Any],
    config: dict[str, Any] | None = None,
    outputs: dict[str, Any] | None = None,
    wrappers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    for i, g in enumerate(graphs):
        if g.get("kind") not in ("full", "piecewise") or "key" not in g or "graph" not in g:
            raise ValueError(f"graphs[{i}]: needs kind (full|piecewise), key and graph index")
        if g["kind"] == "piecewise" and ("wrapper" not in g or "output" not in g):
            raise ValueError(f"graphs[{i}]: a piecewise graph needs its wrapper and output")
    return {
        "version": SECTION_VERSION,
        "vllm_version": version,
        "kv_cache_memory_bytes": int(kv_cache_memory_bytes),
        "kv_budget": dict(kv_budget) if kv_budget else None,
        "cudagraph_mode": cudagraph_mode,
        "config": config or {},
        "graphs": graphs,
        "outputs": outputs or {},
        "wrappers": wrappers or [],
        "compile_cache": compile_cache,
    }


def check_section(section: dict[str, Any], *, vllm_version: str) -> None:
    if section.get("version") != SECTION_VERSION:
        raise ValueError(
            f"vLLM section version {section.get('version')}; this medusa reads {SECTION_VERSION}: "
            "materialize again"
        )
    if section.get("vllm_version") != vllm_version:
        raise ValueError(
            f"the artifact was made with vLLM {section.get('vllm_version')}, this is "
            f"{vllm_version}: materialize again"
        )
    budget = section.get("kv_budget")
    if budget is not None:
        fields = ("requested_memory", "non_kv_bytes")
        if not isinstance(budget, dict) or not all(
            type(budget.get(k)) is int and budget[k] >= 0 for k in fields
        ):
            raise ValueError(
                "the vLLM section's kv_budget needs requested_memory and non_kv_bytes as "
                "non-negative integers: the artifact is damaged; materialize again"
            )
