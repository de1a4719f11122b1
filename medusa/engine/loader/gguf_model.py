"""A llama-architecture model from a GGUF file, with its tokenizer from the GGUF metadata."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from medusa.engine.loader.gguf_file import GGUFFile
from medusa.engine.loader.rope import rope_from_gguf
from medusa.engine.model_error import ModelError
from medusa.engine.spec import ModelSpec
from medusa.engine.tokenizer import Tokenizer

SUPPORTED = ("llama",)


class GGUFModel:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = GGUFFile(path)
        arch = self.file.get("general.architecture")
        if arch not in SUPPORTED:
            raise ModelError(
                f"{path}: architecture {arch!r} is not supported; this engine runs "
                f"{', '.join(SUPPORTED)} (Llama-style) models"
            )
        self.spec = self._spec(arch)

    def _spec(self, arch: str) -> ModelSpec:
        def g(key: str, default: object = None) -> Any:
            v = self.file.get(f"{arch}.{key}", default)
            if v is None:
                raise ModelError(
                    f"{self.path}: metadata {arch}.{key} is missing; the file is incomplete"
                )
            return v

        d, heads = int(g("embedding_length")), int(g("attention.head_count"))
        head_dim = int(g("attention.key_length", d // heads))
        vocab = self.file.get(f"{arch}.vocab_size") or len(
            self.file.get("tokenizer.ggml.tokens", [])
        )
        try:
            return ModelSpec(
                name=str(self.file.get("general.name", self.path.stem)),
                vocab_size=int(vocab),
                hidden_size=d,
                intermediate_size=int(g("feed_forward_length")),
                num_layers=int(g("block_count")),
                num_heads=heads,
                num_kv_heads=int(g("attention.head_count_kv", heads)),
                head_dim=head_dim,
                rope=rope_from_gguf(self.file, arch, head_dim),
                rms_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
                max_position=int(g("context_length", 2048)),
                tie_embeddings="output.weight" not in self.file.tensors,
                rope_neox=False,
            )
        except ModelError:
            raise
        except ValueError as e:  # a metadata value of the wrong kind, or inconsistent ones
            raise ModelError(f"{self.path}: {e}") from None

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_gguf(self.file.metadata, self.path)

    def tokenizer_record(self) -> dict[str, Any]:
        """What a weight store keeps to build the tokenizer without this file."""
        from medusa.engine.loader.tokenizer_record import GGUF_TOKENIZER_KEYS, packed_gguf_tokenizer

        meta = self.file.metadata
        packed = packed_gguf_tokenizer(meta)
        if packed is not None:
            return packed
        kept = {k: meta[k] for k in GGUF_TOKENIZER_KEYS if k in meta}
        for k, v in kept.items():
            if isinstance(v, np.ndarray):
                kept[k] = v.tolist()
        return {"kind": "gguf", "metadata": kept}

    def identity(self) -> str:
        h = hashlib.sha256()
        h.update(self.path.name.encode())
        h.update(str(self.path.stat().st_size).encode())
        h.update(bytes(self.file.data[: self.file.data_start]))
        return f"gguf:{h.hexdigest()}"

    def _tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        w = self.file.load(name)
        if w.shape != shape:
            raise ModelError(
                f"{self.path}: tensor {name} has shape {w.shape}, its metadata makes it {shape}; "
                "the file contradicts itself: convert the model again"
            )
        return w

    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        s = self.spec
        for name, shape in s.weight_shapes().items():
            if name == "embed":
                yield name, self._tensor("token_embd.weight", shape)
            elif name == "norm":
                yield name, self._tensor("output_norm.weight", shape)
            elif name == "lm_head":
                yield name, self._tensor("output.weight", shape)
            else:
                yield name, self._layer(name, shape)

    def _layer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        _, i, part = name.split(".")
        b, s = f"blk.{i}.", self.spec
        if part == "qkv":
            return np.concatenate([
                self._tensor(b + "attn_q.weight", (s.q_size, s.hidden_size)),
                self._tensor(b + "attn_k.weight", (s.kv_size, s.hidden_size)),
                self._tensor(b + "attn_v.weight", (s.kv_size, s.hidden_size)),
            ])  # fmt: skip
        if part == "gate_up":
            f = (s.intermediate_size, s.hidden_size)
            return np.concatenate([self._tensor(b + "ffn_gate.weight", f),
                                   self._tensor(b + "ffn_up.weight", f)])  # fmt: skip
        names = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "o": "attn_output",
                 "down": "ffn_down"}  # fmt: skip
        return self._tensor(b + names[part] + ".weight", shape)
