"""What the engine needs to know about a model's architecture."""

from __future__ import annotations

from dataclasses import dataclass


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
    rope_theta: float
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
