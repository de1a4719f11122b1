"""A Hugging Face-layout checkpoint (config.json, safetensors with BF16, tokenizer.json) loads and
runs: here SmolLM2 converted from its GGUF file back to the HF layout (Q/K un-permuted, so RoPE
works on (i, i + d/2) pairs)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.loader import open_model
from medusa.engine.model_error import ModelError
from medusa.engine.sampling import SamplingParams
from tests.engine.reference import Reference


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """GGUF stores Q/K rows of each head as (x0, x_{d/2}, x1, ...): undo it."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def _bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    src = open_model()
    s = src.spec
    w = dict(src.weights())
    out = tmp_path_factory.mktemp("hf")
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": w["embed"],
        "model.norm.weight": w["norm"],
    }
    for i in range(s.num_layers):
        p, qkv = f"model.layers.{i}.", w[f"layers.{i}.qkv"]
        q, k, v = np.split(qkv, [s.q_size, s.q_size + s.kv_size])
        gate, up = np.split(w[f"layers.{i}.gate_up"], 2)
        tensors.update(
            {
                p + "self_attn.q_proj.weight": _unpermute(q, s.num_heads),
                p + "self_attn.k_proj.weight": _unpermute(k, s.num_kv_heads),
                p + "self_attn.v_proj.weight": v,
                p + "self_attn.o_proj.weight": w[f"layers.{i}.o"],
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": w[f"layers.{i}.down"],
                p + "input_layernorm.weight": w[f"layers.{i}.attn_norm"],
                p + "post_attention_layernorm.weight": w[f"layers.{i}.ffn_norm"],
            }
        )
    f32 = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items() if "norm" not in k}
    save_file(f32, str(out / "model-00001.safetensors"))
    # Norm weights in BF16: safetensors' numpy API cannot write it, so write the file by hand.
    norms = {k: _bf16(v) for k, v in tensors.items() if "norm" in k}
    header, off = {}, 0
    for k, v in norms.items():
        header[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    (out / "model-00002.safetensors").write_bytes(
        len(hb).to_bytes(8, "little") + hb + b"".join(v.tobytes() for v in norms.values())
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "vocab_size": s.vocab_size,
        "rope_theta": s.rope.theta,
        "rms_norm_eps": s.rms_eps,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    }
    (out / "config.json").write_text(json.dumps(config))
    tok = src.tokenizer()
    tok.tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return out


@pytest.mark.e2e  # the whole engine on SmolLM2: tens of seconds
def test_an_hf_checkpoint_runs_and_matches_the_reference(hf_dir):
    m = open_model(hf_dir)
    assert m.spec.rope_neox and m.spec.tie_embeddings
    cfg = EngineConfig(
        max_num_seqs=2, max_num_batched_tokens=128, max_model_len=256, kv_cache_memory=32 << 20
    )
    with LLMEngine(cfg, source=m) as e:
        (text,) = e.generate(
            ["What is the capital of France?"], SamplingParams(max_tokens=10), chat=True
        )
        assert "Paris" in text
        ids = e.tokenizer.encode("The capital of France is")
        seq = e.add_request(ids, SamplingParams(max_tokens=1))
        e.step()
        got = e.runner.last_logits(1)[0]
        assert seq.finish_reason == "length"
    want = Reference(m.spec, dict(m.weights())).forward(ids)[-1]
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


def test_bad_model_directories_say_what_is_missing(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        open_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelError, match="GPT2LMHeadModel is not supported"):
        open_model(tmp_path)
    with pytest.raises(ModelError, match="nothing.bin: does not exist"):
        open_model(tmp_path / "nothing.bin")
    (tmp_path / "weights.bin").write_bytes(b"0")
    with pytest.raises(ModelError, match="weights.bin: is not a model"):
        open_model(tmp_path / "weights.bin")
