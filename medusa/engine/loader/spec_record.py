"""A model's spec as a weight store records it (JSON), checked field by field before the engine
uses it: types, ranges and consistency (KV heads divide the heads, RoPE turns at most the head's
dims, ...). A store is data anyone who can write it may have forged; a spec it carries must be
refused with a reason naming the field, never fail later as a division by zero or a float shape."""

from __future__ import annotations

import math
from typing import Any

from medusa.engine.spec import ROPE_SCALINGS, ModelSpec, RoPE

_BIG = 1 << 24
# field: (kind, low, high); kinds: int, num (finite float or int), bool, str
SPEC = {
    "name": ("str", 0, 256),
    "vocab_size": ("int", 1, _BIG),
    "hidden_size": ("int", 1, 1 << 17),
    "intermediate_size": ("int", 1, 1 << 20),
    "num_layers": ("int", 1, 1 << 12),
    "num_heads": ("int", 1, 1 << 12),
    "num_kv_heads": ("int", 1, 1 << 12),
    "head_dim": ("int", 1, 1 << 12),
    "rms_eps": ("num", 0.0, 1.0),
    "max_position": ("int", 1, _BIG),
    "tie_embeddings": ("bool", 0, 0),
    "rope_neox": ("bool", 0, 0),
    "qkv_bias": ("bool", 0, 0),
}
ROPE = {
    "theta": ("num", 1.0, 1e12),
    "rot_dim": ("int", 2, 1 << 12),
    "scaling": ("str", 0, 16),
    "factor": ("num", 0.0, 1e6),
    "original_max_position": ("int", 0, _BIG),
    "low_freq_factor": ("num", 0.0, 1e6),
    "high_freq_factor": ("num", 0.0, 1e6),
    "beta_fast": ("num", 0.0, 1e6),
    "beta_slow": ("num", 0.0, 1e6),
    "truncate": ("bool", 0, 0),
}
# checked apart: attention_factor (null or a number), freq_divisors (a list of numbers)
ROPE_APART = {"attention_factor", "freq_divisors"}


def spec_from_record(d: Any) -> ModelSpec:
    """The ModelSpec a store's record describes; ValueError naming the first bad field."""
    _fields(d, SPEC, {"rope"}, "spec")
    r = d["rope"]
    _fields(r, ROPE, ROPE_APART, "spec.rope")
    if r["attention_factor"] is not None:
        _check("spec.rope.attention_factor", r["attention_factor"], ("num", 0.0, 1e6))
    divisors = r["freq_divisors"]
    if not isinstance(divisors, list) or len(divisors) not in (0, r["rot_dim"] // 2):
        raise ValueError("spec.rope.freq_divisors: expected none or one number per rotated pair")
    for x in divisors:
        _check("spec.rope.freq_divisors", x, ("num", 0.0, 1e12))
    _consistent(d, r)
    rope = RoPE(**{**r, "freq_divisors": tuple(divisors)})
    return ModelSpec(**{**d, "rope": rope})


def _consistent(d: dict[str, Any], r: dict[str, Any]) -> None:
    if d["num_heads"] % d["num_kv_heads"]:
        raise ValueError(f"spec: {d['num_kv_heads']} KV heads do not divide {d['num_heads']} heads")
    if r["rot_dim"] % 2 or r["rot_dim"] > d["head_dim"]:
        raise ValueError(f"spec.rope.rot_dim {r['rot_dim']}: even and at most head_dim expected")
    if r["scaling"] not in ROPE_SCALINGS:
        raise ValueError(f"spec.rope.scaling {r['scaling'][:16]!r}: one of {ROPE_SCALINGS}")
    if r["scaling"] == "llama3" and r["high_freq_factor"] <= r["low_freq_factor"]:
        raise ValueError("spec.rope: high_freq_factor must exceed low_freq_factor")


def _fields(d: Any, schema: dict[str, tuple[str, float, float]], apart: set[str], at: str) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{at}: expected an object")
    want = set(schema) | apart
    if set(d) != want:
        odd = sorted(set(d) ^ want)[:3]
        raise ValueError(f"{at}: missing or unknown fields {', '.join(map(str, odd))}")
    for name, rule in schema.items():
        _check(f"{at}.{name}", d[name], rule)


def _check(at: str, v: Any, rule: tuple[str, float, float]) -> None:
    kind, lo, hi = rule
    if kind == "bool":
        ok = isinstance(v, bool)
    elif kind == "str":
        ok = isinstance(v, str) and lo <= len(v) <= hi
    elif kind == "int":
        ok = type(v) is int and lo <= v <= hi
    else:
        ok = type(v) in (int, float) and math.isfinite(v) and lo < v <= hi
    if not ok:
        shown = repr(v)[:40]
        raise ValueError(f"{at} is {shown}: expected {_expected(kind, lo, hi)}")


def _expected(kind: str, lo: float, hi: float) -> str:
    if kind == "bool":
        return "true or false"
    if kind == "str":
        return f"a string of at most {int(hi)} characters"
    if kind == "int":
        return f"an integer in [{int(lo)}, {int(hi)}]"
    return f"a finite number in ({lo:g}, {hi:g}]"
