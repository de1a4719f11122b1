"""`weaving: {enabled, ratio}` of a hot model in the gateway's models.yaml, validated.

    models:
      llama-8b:
        weaving: {enabled: true, ratio: 0.45}   # offload 45% of its decode batch's attention

`ratio` is the share of the hot model's sequences (fixed after prefill) whose attention, with their
KV, runs on a paired cold model's worker; Weaver's evaluation uses 0.45."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_RATIO = 0.45
FIELDS = ("enabled", "ratio")


@dataclass(frozen=True)
class WeavingConfig:
    enabled: bool = False
    ratio: float = DEFAULT_RATIO

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"weaving.ratio {self.ratio}: must be in (0, 1]")


def parse_weaving(value: Any, model: str) -> WeavingConfig:
    """The `weaving` entry of model `model` (None or absent: off). Raises ValueError naming the
    model, the field and what to write instead."""
    where = f"models.{model}.weaving"
    if value is None:
        return WeavingConfig()
    if isinstance(value, bool):
        return WeavingConfig(enabled=value)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a mapping like {{enabled: true, ratio: 0.45}}, got "
                         f"{type(value).__name__}")  # fmt: skip
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {list(FIELDS)}")
    enabled = value.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"{where}.enabled: expected true or false, got {enabled!r}")
    ratio = value.get("ratio", DEFAULT_RATIO)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float):
        raise ValueError(f"{where}.ratio: expected a number in (0, 1], got {ratio!r}")
    if not 0.0 < ratio <= 1.0:
        raise ValueError(
            f"{where}.ratio: {ratio} is outside (0, 1]; it is the share of the batch offloaded "
            "(0.45 in Weaver's evaluation; to offload nothing set enabled: false)"
        )
    return WeavingConfig(enabled=enabled, ratio=float(ratio))
