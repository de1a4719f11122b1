"""A Hugging Face-layout checkpoint: config.json, *.safetensors and tokenizer.json, for Llama-
and Qwen2-style models. Weights are read with the safetensors package."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from medusa.engine.loader.rope import rope_from_config
from medusa.engine.model_error import ModelError
from medusa.engine.spec import ModelSpec
from medusa.engine.tokenizer import Tokenizer

ARCHITECTURES = {"LlamaForCausalLM": False, "Qwen2ForCausalLM": True}  # -> has q/k/v biases
FLOATS = ("F32", "F16", "BF16", "F64")
# Canonical name -> the checkpoint's, for the weights taken as they are.
_TOP_LEVEL = {
    "embed": "model.embed_tokens.weight",
    "norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}
_LAYER = {
    "attn_norm": "input_layernorm.weight",
    "o": "self_attn.o_proj.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "down": "mlp.down_proj.weight",
}


class SafetensorsFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.handle = safe_open(str(path), framework="numpy")
        except SafetensorError as e:
            raise ModelError(
                f"{path}: not a safetensors file, or a damaged one ({e}); download it again"
            ) from None
        self.names: list[str] = list(self.handle.keys())
        with path.open("rb") as f:
            size = f.read(8)
            self.header = size + f.read(int.from_bytes(size, "little"))  # as safe_open checked it
        self._entries: dict[str, dict] | None = None

    def load(self, name: str) -> np.ndarray:
        dtype = self.handle.get_slice(name).get_dtype()
        if dtype not in FLOATS:
            raise ModelError(
                f"{self.path}: {name} is {dtype}; {', '.join(FLOATS)} are read (use an "
                "unquantized checkpoint, or a GGUF file for quantized weights)"
            )
        if dtype == "BF16":
            return self._bf16(name)
        return np.asarray(self.handle.get_tensor(name), dtype=np.float32)

    def _bf16(self, name: str) -> np.ndarray:
        # NOTE: numpy has no bfloat16, so safetensors' numpy reader refuses BF16 (TypeError);
        # its bits are the top half of a float32's, read here from the offsets in the header.
        if self._entries is None:
            self._entries = json.loads(self.header[8:])
        entry = self._entries[name]
        a, b = entry["data_offsets"]
        start = len(self.header) + a
        raw = np.memmap(self.path, dtype="<u2", mode="r", offset=start, shape=(b - a) // 2)
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


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
        self.index = {n: f for f in self.files for n in f.names}
        self.qkv_bias = ARCHITECTURES[arch]
        try:
            self.spec = self._spec(cfg, cfg_path)
        except ModelError:
            raise
        except KeyError as e:
            raise ModelError(
                f"{cfg_path}: {e.args[0]} is missing; the config is incomplete"
            ) from None
        except ValueError as e:  # a value of the wrong kind, or values that contradict
            raise ModelError(f"{cfg_path}: {e}") from None

    def _spec(self, cfg: dict, cfg_path: Path) -> ModelSpec:
        heads, d = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or d // heads)
        return ModelSpec(
            name=self.path.name,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=d,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=head_dim,
            rope=rope_from_config(cfg, head_dim, cfg_path),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position=int(cfg.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False))
            or "lm_head.weight" not in self.index,
            rope_neox=True,
            qkv_bias=self.qkv_bias,
        )

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_directory(self.path)

    def tokenizer_record(self) -> dict:
        """What a weight store keeps to build the tokenizer without this directory."""
        tok = self.tokenizer()
        cfg_path = self.path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        return {
            "kind": "json",
            "json": tok.tk.to_str(),
            "eos_ids": list(tok.eos_ids),
            "chat_template": cfg.get("chat_template"),
            "bos": tok.bos,
            "eos": tok.eos,
        }

    def identity(self) -> str:
        h = hashlib.sha256((self.path / "config.json").read_bytes())
        for f in self.files:
            h.update(f.path.name.encode())
            h.update(f.header)
        return f"hf:{h.hexdigest()}"

    def _get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        f = self.index.get(name)
        if f is None:
            raise ModelError(
                f"{self.path}: weight {name} is missing; the checkpoint is incomplete (are all "
                "its *.safetensors shards there?)"
            )
        w = f.load(name)
        if w.shape != shape:
            raise ModelError(
                f"{self.path}: {name} has shape {w.shape}, config.json makes it {shape}; the "
                "weights do not belong to this config.json"
            )
        return w

    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        for name, shape in self.spec.weight_shapes().items():
            if name in _TOP_LEVEL:
                yield name, self._get(_TOP_LEVEL[name], shape)
            else:
                _, i, part = name.split(".")
                yield name, self._layer_weight(f"model.layers.{i}.", part, shape)

    def _layer_weight(self, p: str, part: str, shape: tuple[int, ...]) -> np.ndarray:
        """One of a layer's weights (p: its name prefix); q, k and v (weights or biases) and
        gate and up are fused, as the engine runs them."""
        s = self.spec
        d, f = s.hidden_size, s.intermediate_size
        a = p + "self_attn."
        if part == "qkv":
            return np.concatenate(
                [
                    self._get(a + "q_proj.weight", (s.q_size, d)),
                    self._get(a + "k_proj.weight", (s.kv_size, d)),
                    self._get(a + "v_proj.weight", (s.kv_size, d)),
                ]
            )
        if part == "qkv_bias":
            return np.concatenate(
                [
                    self._get(a + "q_proj.bias", (s.q_size,)),
                    self._get(a + "k_proj.bias", (s.kv_size,)),
                    self._get(a + "v_proj.bias", (s.kv_size,)),
                ]
            )
        if part == "gate_up":
            return np.concatenate(
                [
                    self._get(p + "mlp.gate_proj.weight", (f, d)),
                    self._get(p + "mlp.up_proj.weight", (f, d)),
                ]
            )
        return self._get(p + _LAYER[part], shape)
