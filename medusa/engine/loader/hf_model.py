"""A Hugging Face-layout checkpoint: config.json, *.safetensors (F32, F16 or BF16) and
tokenizer.json, for Llama- and Qwen2-style models."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from medusa.engine.loader.errors import ModelError
from medusa.engine.spec import ModelSpec
from medusa.engine.tokenizer import Tokenizer

ARCHITECTURES = {"LlamaForCausalLM": False, "Qwen2ForCausalLM": True}  # -> has q/k/v biases
_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


class SafetensorsFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = np.memmap(path, dtype=np.uint8, mode="r")
        (n,) = struct.unpack_from("<Q", self.data[:8].tobytes())
        try:
            header = json.loads(self.data[8 : 8 + n].tobytes())
        except ValueError as e:
            raise ModelError(f"{path}: not a safetensors file ({e})") from None
        header.pop("__metadata__", None)
        self.start = 8 + n
        self.entries: dict[str, dict] = header

    def load(self, name: str) -> np.ndarray:
        e = self.entries[name]
        if e["dtype"] not in _DTYPES:
            raise ModelError(f"{self.path}: {name} is {e['dtype']}; F32, F16 and BF16 are read")
        a, b = e["data_offsets"]
        raw = self.data[self.start + a : self.start + b].view(_DTYPES[e["dtype"]])
        out = (raw.astype(np.uint32) << 16).view(np.float32) if e["dtype"] == "BF16" else raw
        return np.asarray(out, dtype=np.float32).reshape(e["shape"])


class HFModel:
    def __init__(self, path: Path) -> None:
        self.path = path
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ModelError(f"{path}: no config.json; a model directory needs config.json, "
                             "*.safetensors and tokenizer.json")  # fmt: skip
        cfg = json.loads(cfg_path.read_text())
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in ARCHITECTURES:
            raise ModelError(f"{cfg_path}: architecture {arch} is not supported; this engine runs "
                             f"{', '.join(ARCHITECTURES)}")  # fmt: skip
        self.files = [SafetensorsFile(p) for p in sorted(path.glob("*.safetensors"))]
        if not self.files:
            raise ModelError(f"{path}: no *.safetensors weights")
        self.index = {n: f for f in self.files for n in f.entries}
        heads = int(cfg["num_attention_heads"])
        d = int(cfg["hidden_size"])
        self.qkv_bias = ARCHITECTURES[arch]
        self.spec = ModelSpec(
            name=path.name,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=d,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or d // heads),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position=int(cfg.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False))
            or "lm_head.weight" not in self.index,
            rope_neox=True,
            qkv_bias=self.qkv_bias,
        )

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_directory(self.path)

    def identity(self) -> str:
        h = hashlib.sha256((self.path / "config.json").read_bytes())
        for f in self.files:
            h.update(f.path.name.encode())
            h.update(f.data[: f.start].tobytes())
        return f"hf:{h.hexdigest()}"

    def _get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        f = self.index.get(name)
        if f is None:
            raise ModelError(f"{self.path}: weight {name} is missing")
        w = f.load(name)
        if w.shape != shape:
            raise ModelError(f"{self.path}: {name} has shape {w.shape}, expected {shape}")
        return w

    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        s = self.spec
        d, f = s.hidden_size, s.intermediate_size
        for name, shape in s.weight_shapes().items():
            if name == "embed":
                yield name, self._get("model.embed_tokens.weight", shape)
            elif name == "norm":
                yield name, self._get("model.norm.weight", shape)
            elif name == "lm_head":
                yield name, self._get("lm_head.weight", shape)
            else:
                _, i, part = name.split(".")
                p = f"model.layers.{i}."
                a = p + "self_attn."
                if part == "qkv":
                    yield (
                        name,
                        np.concatenate(
                            [
                                self._get(a + "q_proj.weight", (s.q_size, d)),
                                self._get(a + "k_proj.weight", (s.kv_size, d)),
                                self._get(a + "v_proj.weight", (s.kv_size, d)),
                            ]
                        ),
                    )
                elif part == "qkv_bias":
                    yield (
                        name,
                        np.concatenate(
                            [
                                self._get(a + "q_proj.bias", (s.q_size,)),
                                self._get(a + "k_proj.bias", (s.kv_size,)),
                                self._get(a + "v_proj.bias", (s.kv_size,)),
                            ]
                        ),
                    )
                elif part == "gate_up":
                    yield (
                        name,
                        np.concatenate(
                            [
                                self._get(p + "mlp.gate_proj.weight", (f, d)),
                                self._get(p + "mlp.up_proj.weight", (f, d)),
                            ]
                        ),
                    )
                else:
                    hf = {"attn_norm": "input_layernorm.weight", "o": "self_attn.o_proj.weight",
                          "ffn_norm": "post_attention_layernorm.weight",
                          "down": "mlp.down_proj.weight"}[part]  # fmt: skip
                    yield name, self._get(p + hf, shape)
