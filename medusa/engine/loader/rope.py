"""A model's RoPE as its files describe it: GGUF metadata (with the rope_freqs.weight tensor that
Llama 3 files carry) or config.json's rope_scaling / rope_parameters. Scalings the engine does not
implement are refused by key and value rather than run wrongly."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from medusa.engine.loader.gguf_file import GGUFFile
from medusa.engine.model_error import ModelError
from medusa.engine.spec import RoPE

SUPPORTED = "default (none), linear, llama3 and yarn"
# config.json's rope_type -> RoPE.scaling
_HF_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3", "yarn": "yarn"}
_GGUF_TYPES = ("none", "linear", "llama3", "yarn")


def rope_from_gguf(file: GGUFFile, arch: str, head_dim: int) -> RoPE:
    def get(key: str, default: Any = None, conv: Any = None) -> Any:
        value = file.get(f"{arch}.{key}", default)
        return value if conv is None else _convert(conv, value, file.path, f"{arch}.{key}")

    kind = str(get("rope.scaling.type", "none"))
    factor = get("rope.scaling.factor", 0.0, float) or 1.0
    if kind == "none" and get("rope.scale_linear") is not None:  # the key of older files
        kind, factor = "linear", get("rope.scale_linear", conv=float)
    if kind not in _GGUF_TYPES:
        raise ModelError(
            f"{file.path}: {arch}.rope.scaling.type is {kind!r}; this engine runs {SUPPORTED} "
            f"RoPE scaling (use a model without {kind} scaling)"
        )
    divisors: tuple[float, ...] = ()
    if "rope_freqs.weight" in file.tensors:
        divisors = tuple(float(x) for x in file.load("rope_freqs.weight").reshape(-1))
        if kind == "llama3":
            kind = "none"  # llama.cpp's form of llama3 scaling: the divisors are the scaling
    attention_factor = None
    if kind == "yarn":  # as llama.cpp: attn_factor scales YaRN's own magnitude correction
        attention_factor = get("rope.scaling.attn_factor", 1.0, float) * _yarn_mscale(factor)
    return _rope(
        file.path,
        theta=get("rope.freq_base", 10000.0, float),
        rot_dim=get("rope.dimension_count", head_dim, int),
        scaling=kind,
        factor=factor,
        original_max_position=get("rope.scaling.original_context_length", 0, int),
        beta_fast=get("rope.scaling.yarn_beta_fast", 32.0, float),
        beta_slow=get("rope.scaling.yarn_beta_slow", 1.0, float),
        attention_factor=attention_factor,
        freq_divisors=divisors,
    )


def rope_from_config(cfg: dict[str, Any], head_dim: int, where: Path) -> RoPE:
    """From config.json: rope_parameters (transformers 5) or rope_scaling, with rope_type or
    type; rope_theta and partial_rotary_factor at the top level or inside."""
    key = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    p: dict[str, Any] = cfg.get(key) or {}
    if not isinstance(p, dict):
        raise ModelError(f"{where}: {key} is {p!r:.40}, not an object; the file is damaged")
    field = "rope_type" if "rope_type" in p else "type"
    kind = str(p.get(field, "default"))
    if kind not in _HF_TYPES:
        raise ModelError(
            f"{where}: {key}.{field} is {kind!r}; this engine runs {SUPPORTED} RoPE scaling "
            f"(use a model without {kind} scaling)"
        )

    def get(name: str, default: Any, conv: Any = float, top: bool = False) -> Any:
        value = p.get(name, cfg.get(name, default) if top else default)
        return _convert(conv, value, where, f"{key}.{name}")

    factor = get("factor", 1.0)
    original = p.get("original_max_position_embeddings")
    if original is None and kind == "yarn":  # as transformers: yarn falls back to the config's
        original = cfg.get("max_position_embeddings")
    partial = get("partial_rotary_factor", 1.0, top=True)
    return _rope(
        where,
        theta=get("rope_theta", 10000.0, top=True),
        rot_dim=int(head_dim * partial),
        scaling=_HF_TYPES[kind],
        factor=factor,
        original_max_position=_convert(int, original or 0, where, f"{key}.original_max_position"),
        low_freq_factor=get("low_freq_factor", 1.0),
        high_freq_factor=get("high_freq_factor", 4.0),
        beta_fast=get("beta_fast", None) if p.get("beta_fast") else 32.0,
        beta_slow=get("beta_slow", None) if p.get("beta_slow") else 1.0,
        truncate=bool(p.get("truncate", True)),
        attention_factor=_hf_attention_factor(p, factor) if kind == "yarn" else None,
    )


def _convert(conv: Any, value: Any, where: Path, key: str) -> Any:
    """value as conv (int or float); ModelError naming the key when the file holds another type."""
    try:
        return conv(value)
    except (TypeError, ValueError, OverflowError):
        raise ModelError(
            f"{where}: {key} is {value!r:.40}, not a {conv.__name__}; the file is damaged "
            "(fix the value or convert the model again)"
        ) from None


def _hf_attention_factor(p: dict[str, Any], factor: float) -> float:
    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])
    mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
    if mscale and mscale_all_dim:  # DeepSeek's form
        return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all_dim))
    return _yarn_mscale(factor)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _rope(where: Path, **kw: Any) -> RoPE:
    try:
        return RoPE(**kw)
    except ValueError as e:
        raise ModelError(f"{where}: {e}") from None
