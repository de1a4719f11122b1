"""What the engine needs to know about a model's architecture."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ROPE_SCALINGS = ("none", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RoPE:
    """How positions rotate Q and K: the first rot_dim dims of each head turn at the frequencies
    inv_freq() gives; cos and sin are multiplied by mscale (YaRN's attention factor)."""

    theta: float
    rot_dim: int
    scaling: str = "none"  # one of ROPE_SCALINGS
    factor: float = 1.0  # linear, llama3, yarn: how much longer the context is made
    original_max_position: int = 0  # llama3, yarn: the context the model was trained on
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn: rotations below which a frequency is interpolated...
    beta_slow: float = 1.0  # ...and above which it is kept
    truncate: bool = True  # yarn: round the correction range to whole dims
    attention_factor: float | None = None  # yarn: replaces 0.1 ln(factor) + 1
    freq_divisors: tuple[float, ...] = ()  # per frequency (GGUF rope_freqs.weight)

    def __post_init__(self) -> None:
        if self.scaling not in ROPE_SCALINGS:
            raise ValueError(
                f"RoPE scaling {self.scaling!r}: use one of {', '.join(ROPE_SCALINGS)}"
            )
        if self.rot_dim <= 0 or self.rot_dim % 2:
            raise ValueError(f"RoPE dimension count {self.rot_dim}: it must be even and positive")
        if self.factor <= 0:
            raise ValueError(f"RoPE scaling factor {self.factor}: it must be positive")
        if self.scaling in ("llama3", "yarn") and self.original_max_position <= 0:
            raise ValueError(
                f"{self.scaling} RoPE scaling needs the original context length "
                f"(original_max_position_embeddings), got {self.original_max_position}"
            )
        if self.freq_divisors and len(self.freq_divisors) != self.rot_dim // 2:
            raise ValueError(
                f"{len(self.freq_divisors)} RoPE frequency divisors for {self.rot_dim // 2} "
                "frequencies: give one per rotated pair"
            )

    def inv_freq(self) -> np.ndarray:
        """The rotation frequencies, float32 [rot_dim / 2]: pair i turns by position * f[i]."""
        r = self.rot_dim
        f = self.theta ** (-np.arange(0, r, 2, dtype=np.float64) / r)
        if self.scaling == "linear":
            f = f / self.factor
        elif self.scaling == "llama3":
            f = self._llama3(f)
        elif self.scaling == "yarn":
            f = self._yarn(f)
        if self.freq_divisors:
            f = f / np.asarray(self.freq_divisors, np.float64)
        return f.astype(np.float32)

    @property
    def mscale(self) -> float:
        if self.scaling != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0

    def _llama3(self, f: np.ndarray) -> np.ndarray:
        # Long wavelengths are interpolated, short ones kept, those between blended.
        old, lo, hi = self.original_max_position, self.low_freq_factor, self.high_freq_factor
        wavelen = 2 * math.pi / f
        smooth = np.clip((old / wavelen - lo) / (hi - lo), 0.0, 1.0)
        return (1 - smooth) * f / self.factor + smooth * f

    def _yarn(self, f: np.ndarray) -> np.ndarray:
        r, base, ctx = self.rot_dim, self.theta, self.original_max_position

        def dim(rotations: float) -> float:
            return r * math.log(ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = dim(self.beta_fast), dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, r - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(r // 2) - low) / (high - low), 0.0, 1.0)
        return f / self.factor * ramp + f * (1 - ramp)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: RoPE
    rms_eps: float
    max_position: int
    tie_embeddings: bool
    rope_neox: bool  # True: pairs (i, i + d/2) as in HF checkpoints; False: adjacent, as in GGUF
    qkv_bias: bool = False  # Qwen2

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{self.name}: {self.num_heads} attention heads do not divide into "
                f"{self.num_kv_heads} KV heads"
            )
        if self.rope.rot_dim > self.head_dim:
            raise ValueError(
                f"{self.name}: RoPE rotates {self.rope.rot_dim} dims of {self.head_dim}-dim heads; "
                "the dimension count must not exceed the head size"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_size(self) -> int:
        return self.q_size + 2 * self.kv_size

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """The engine's weights, by canonical name, in the order they are allocated and loaded."""
        d, f = self.hidden_size, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab_size, d)}
        for i in range(self.num_layers):
            shapes[f"layers.{i}.attn_norm"] = (d,)
            shapes[f"layers.{i}.qkv"] = (self.qkv_size, d)
            if self.qkv_bias:
                shapes[f"layers.{i}.qkv_bias"] = (self.qkv_size,)
            shapes[f"layers.{i}.o"] = (d, self.q_size)
            shapes[f"layers.{i}.ffn_norm"] = (d,)
            shapes[f"layers.{i}.gate_up"] = (2 * f, d)
            shapes[f"layers.{i}.down"] = (d, f)
        shapes["norm"] = (d,)
        if not self.tie_embeddings:
            shapes["lm_head"] = (self.vocab_size, d)
        return shapes

    @property
    def num_params(self) -> int:
        total = 0
        for s in self.weight_shapes().values():
            n = 1
            for x in s:
                n *= x
            total += n
        return total
