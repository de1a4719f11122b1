"""Tiny Llama-style models with random weights, written the way people get them: a GGUF file by
gguf.GGUFWriter in any ggml type, or a Hugging Face directory (config.json, safetensors,
tokenizer.json). Each writer returns the float32 weights the engine must see, by canonical name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from safetensors.numpy import save_file

# A block's f16 scales (byte offsets) and a scale size that gives weights of about 0.05: the
# K-quants gguf can dequantize but not quantize, so their blocks are random bytes around these.
K_SCALES = {T.Q2_K: ((80, 82), 3e-3), T.Q3_K: ((108,), 1e-3), T.Q4_K: ((0, 2), 1e-4),
            T.Q5_K: ((0, 2), 5e-5), T.Q6_K: ((208,), 2e-5)}  # fmt: skip
DIMS = {"hidden": 256, "ffn": 512, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 257}


def encode(shape: tuple[int, ...], qtype: T, rng: np.random.Generator) -> np.ndarray:
    """A random tensor of numpy shape `shape`, as GGUFWriter.add_tensor takes it for qtype."""
    x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    if qtype == T.F32:
        return x
    if qtype == T.F16:
        return x.astype(np.float16)
    if qtype not in K_SCALES:
        return gguf.quants.quantize(x, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape)) // block
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    offsets, scale = K_SCALES[qtype]
    for off in offsets:
        d = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n) * scale
        blocks[:, off : off + 2] = d.astype(np.float16).view(np.uint8).reshape(n, 2)
    return blocks.reshape(*shape[:-1], -1)


def decode(raw: np.ndarray, qtype: T) -> np.ndarray:
    """What the file holds, as gguf.quants.dequantize gives it."""
    return np.asarray(gguf.quants.dequantize(raw, qtype), np.float32)


MERGE = ("\u0120", "\u0120")  # the byte-level form of a space


def byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet (one token per byte) and one merge: two spaces."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)] + [MERGE[0] * 2]


def tensor_names(layers: int) -> dict[str, tuple[str, ...]]:
    """Canonical weight -> the GGUF tensors it is made of (concatenated in this order)."""
    names: dict[str, tuple[str, ...]] = {"embed": ("token_embd.weight",)}
    for i in range(layers):
        b = f"blk.{i}."
        names |= {
            f"layers.{i}.attn_norm": (b + "attn_norm.weight",),
            f"layers.{i}.qkv": (b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"),
            f"layers.{i}.o": (b + "attn_output.weight",),
            f"layers.{i}.ffn_norm": (b + "ffn_norm.weight",),
            f"layers.{i}.gate_up": (b + "ffn_gate.weight", b + "ffn_up.weight"),
            f"layers.{i}.down": (b + "ffn_down.weight",),
        }
    return names | {"norm": ("output_norm.weight",), "lm_head": ("output.weight",)}


def _shapes(d: dict[str, int]) -> dict[str, tuple[int, ...]]:
    h, f, hd = d["hidden"], d["ffn"], d["hidden"] // d["heads"]
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (d["vocab"], h)}
    for i in range(d["layers"]):
        b = f"blk.{i}."
        shapes |= {
            b + "attn_norm.weight": (h,),
            b + "attn_q.weight": (d["heads"] * hd, h),
            b + "attn_k.weight": (d["kv_heads"] * hd, h),
            b + "attn_v.weight": (d["kv_heads"] * hd, h),
            b + "attn_output.weight": (h, d["heads"] * hd),
            b + "ffn_norm.weight": (h,),
            b + "ffn_gate.weight": (f, h),
            b + "ffn_up.weight": (f, h),
            b + "ffn_down.weight": (h, f),
        }
    return shapes | {"output_norm.weight": (h,), "output.weight": (d["vocab"], h)}


def write_gguf(
    path: Path,
    types: list[T],
    metadata: dict[str, Any] | None = None,
    extra: dict[str, np.ndarray] | None = None,
    seed: int = 0,
    dims: dict[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """A tiny llama GGUF; the matrices take the types in turn (norms stay F32). metadata: more or
    other llama.* keys (without the prefix); extra: more F32 tensors; dims: other DIMS. Returns
    the canonical weights."""
    rng = np.random.default_rng(seed)
    d = DIMS | (dims or {})
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    base: dict[str, Any] = {"block_count": d["layers"], "context_length": 256,
                            "embedding_length": d["hidden"], "feed_forward_length": d["ffn"],
                            "attention.head_count": d["heads"],
                            "attention.head_count_kv": d["kv_heads"],
                            "attention.layer_norm_rms_epsilon": 1e-5,
                            "rope.freq_base": 10000.0}  # fmt: skip
    for key, value in (base | (metadata or {})).items():
        if isinstance(value, str):
            w.add_string(f"llama.{key}", value)
        elif isinstance(value, int):
            w.add_uint32(f"llama.{key}", value)
        else:
            w.add_float32(f"llama.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(byte_tokens())
    w.add_token_merges([" ".join(MERGE)])
    w.add_eos_token_id(0)
    raw: dict[str, np.ndarray] = {}
    matrices = 0
    for name, shape in _shapes(d).items():
        if len(shape) == 1:
            x = (1.0 + rng.standard_normal(shape) * 0.1).astype(np.float32)
            w.add_tensor(name, x)
            raw[name] = x
            continue
        qtype = types[matrices % len(types)]
        matrices += 1
        x = encode(shape, qtype, rng)
        w.add_tensor(name, x, raw_dtype=qtype if x.dtype == np.uint8 else None)
        raw[name] = decode(x, qtype)
    for name, x in (extra or {}).items():
        w.add_tensor(name, x.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    names = tensor_names(d["layers"]).items()
    return {k: np.concatenate([raw[p] for p in parts]) for k, parts in names}


def _bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def write_hf(path: Path, config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny LlamaForCausalLM directory: matrices in F16 (read by safetensors), norms in BF16
    (written by hand: safetensors' numpy API has no bfloat16). Returns the canonical weights."""
    rng = np.random.default_rng(seed)
    d = DIMS
    h, f, hd = d["hidden"], d["ffn"], d["hidden"] // d["heads"]
    path.mkdir(parents=True, exist_ok=True)
    mats: dict[str, tuple[int, int]] = {"model.embed_tokens.weight": (d["vocab"], h),
                                        "lm_head.weight": (d["vocab"], h)}  # fmt: skip
    norms: dict[str, tuple[int]] = {"model.norm.weight": (h,)}
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        mats |= {p + "self_attn.q_proj.weight": (d["heads"] * hd, h),
                 p + "self_attn.k_proj.weight": (d["kv_heads"] * hd, h),
                 p + "self_attn.v_proj.weight": (d["kv_heads"] * hd, h),
                 p + "self_attn.o_proj.weight": (h, d["heads"] * hd),
                 p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                 p + "mlp.down_proj.weight": (h, f)}  # fmt: skip
        norms |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    f16 = {k: (rng.standard_normal(s) * 0.05).astype(np.float16) for k, s in mats.items()}
    save_file(f16, str(path / "model-00001-of-00002.safetensors"))
    bf = {k: _bf16(1.0 + rng.standard_normal(s) * 0.1) for k, s in norms.items()}
    header, off = {}, 0
    for k, v in bf.items():
        header[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    (path / "model-00002-of-00002.safetensors").write_bytes(
        len(hb).to_bytes(8, "little") + hb + b"".join(v.tobytes() for v in bf.values())
    )
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": h, "intermediate_size": f,
           "num_hidden_layers": d["layers"], "num_attention_heads": d["heads"],
           "num_key_value_heads": d["kv_heads"], "vocab_size": d["vocab"], "rms_norm_eps": 1e-5,
           "max_position_embeddings": 256, "tie_word_embeddings": False} | config  # fmt: skip
    (path / "config.json").write_text(json.dumps(cfg))
    _write_tokenizer(path)
    w = {k: v.astype(np.float32) for k, v in f16.items()}
    w |= {k: (v.astype(np.uint32) << 16).view(np.float32) for k, v in bf.items()}
    out = {"embed": w["model.embed_tokens.weight"], "norm": w["model.norm.weight"],
           "lm_head": w["lm_head.weight"]}  # fmt: skip
    for i in range(d["layers"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out |= {
            f"layers.{i}.attn_norm": w[p + "input_layernorm.weight"],
            f"layers.{i}.qkv": np.concatenate(
                [w[a + "q_proj.weight"], w[a + "k_proj.weight"], w[a + "v_proj.weight"]]
            ),  # fmt: skip
            f"layers.{i}.o": w[a + "o_proj.weight"],
            f"layers.{i}.ffn_norm": w[p + "post_attention_layernorm.weight"],
            f"layers.{i}.gate_up": np.concatenate(
                [w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]
            ),  # fmt: skip
            f"layers.{i}.down": w[p + "mlp.down_proj.weight"],
        }
    return out


def _write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens = byte_tokens()
    tk = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [MERGE], fuse_unk=False))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": tokens[0]}))


def write_qwen2(path: Path) -> None:
    """write_hf's model with Qwen2's architecture: q/k/v projections with biases."""
    write_hf(path, {"architectures": ["Qwen2ForCausalLM"]})
    rng = np.random.default_rng(7)
    hd, biases = DIMS["hidden"] // DIMS["heads"], {}
    for i in range(DIMS["layers"]):
        a = f"model.layers.{i}.self_attn."
        for name, heads in (("q", DIMS["heads"]), ("k", DIMS["kv_heads"]), ("v", DIMS["kv_heads"])):
            biases[f"{a}{name}_proj.bias"] = (rng.standard_normal(heads * hd) * 0.1).astype(
                np.float16
            )
    save_file(biases, str(path / "model-bias.safetensors"))
