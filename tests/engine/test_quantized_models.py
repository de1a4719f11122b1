"""GGUF files in the types people download (K-quants above all), written by gguf's own writer,
load as gguf.quants.dequantize reads them, and the engine's logits and greedy tokens match the
numpy reference, with plain, scaled and partial RoPE; a safetensors checkpoint with llama3
scaling too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import quantize

from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.loader import open_model
from medusa.engine.loader.gguf_file import GGUFFile
from medusa.engine.sampling import SamplingParams
from medusa.engine.spec import RoPE
from tests.engine.reference import Reference
from tests.engine.test_rope import llamacpp_rope_freqs
from tests.engine.tiny_models import decode, encode, write_gguf, write_hf

TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
         T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]  # fmt: skip
PROMPT = list(range(5, 45))


def test_every_ggml_type_loads_as_gguf_dequantizes_it(tmp_path):
    rng = np.random.default_rng(1)
    f = tmp_path / "types.gguf"
    w = GGUFWriter(str(f), "llama")
    raw = {t: encode((3, 512), t, rng) for t in TYPES}
    raw[T.Q4_K] = encode((8000, 256), T.Q4_K, rng)  # more than one megabyte: read in pieces
    for t, x in raw.items():
        w.add_tensor(t.name, x, raw_dtype=t if x.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    file = GGUFFile(f)
    for t, x in raw.items():
        got = file.load(t.name)
        assert got.dtype == np.float32 and got.shape == (len(x), 256 if t == T.Q4_K else 512)
        np.testing.assert_array_equal(got, decode(x, t), err_msg=t.name)


def test_quantized_weights_are_close_to_what_was_quantized(tmp_path):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 256)) * 0.05).astype(np.float32)
    f = tmp_path / "q.gguf"
    w = GGUFWriter(str(f), "llama")
    w.add_tensor("f16", x.astype(np.float16))
    for t in (T.BF16, T.Q8_0, T.Q4_1):
        w.add_tensor(t.name, quantize(x, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    file = GGUFFile(f)
    block_max = np.abs(x.reshape(-1, 32)).max(1).reshape(4, 8).repeat(32, 1)
    np.testing.assert_allclose(file.load("f16"), x, rtol=1e-3, atol=1e-7)
    np.testing.assert_allclose(file.load("BF16"), x, rtol=8e-3, atol=1e-7)
    assert np.all(np.abs(file.load("Q8_0") - x) <= block_max / 127 + 1e-7)
    assert np.all(np.abs(file.load("Q4_1") - x) <= block_max * 2 / 15 + 1e-7)


ROPES = {
    "plain": {},
    "yarn, partial": {
        "rope.dimension_count": 32,
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 32,
    },
    "linear": {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0},
    "llama3 (rope_freqs)": {},
}
MIXES = {
    "plain": [T.Q4_K, T.Q6_K, T.Q8_0, T.F16, T.Q5_K],
    "yarn, partial": [T.Q4_K, T.Q6_K],
    "linear": [T.Q2_K, T.Q3_K, T.Q4_0, T.BF16],
    "llama3 (rope_freqs)": [T.Q6_K, T.Q4_K, T.Q5_1, T.Q4_1],
}


def _run(model) -> tuple[np.ndarray, list[int]]:
    """The engine's prefill logits for PROMPT, and six greedy tokens (decoded by graph replay)."""
    cfg = EngineConfig(
        max_num_seqs=2, max_num_batched_tokens=64, max_model_len=128, kv_cache_memory=8 << 20
    )
    with LLMEngine(cfg, source=model) as e:
        seq = e.add_request(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True))
        e.step()
        logits = e.runner.last_logits(1)[0].copy()
        while e.has_unfinished():
            e.step()
        return logits, seq.completion_ids


def _check(model, want: dict[str, np.ndarray]) -> np.ndarray:
    got = dict(model.weights())
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    logits, tokens = _run(model)
    ref = Reference(model.spec, want).forward(PROMPT)[-1]
    np.testing.assert_allclose(logits, ref, rtol=2e-3, atol=2e-3)
    assert tokens == Reference(model.spec, want).greedy(PROMPT, 6, set())
    return ref


@pytest.mark.parametrize("rope", ROPES)
def test_a_quantized_gguf_model_runs_as_the_reference_does(tmp_path, rope):
    f = tmp_path / "tiny.gguf"
    extra = {}
    if rope.startswith("llama3"):
        extra["rope_freqs.weight"] = llamacpp_rope_freqs(10000.0, 64, 8.0, 1.0, 4.0, 32)
    want = write_gguf(f, MIXES[rope], ROPES[rope], extra)
    model = open_model(f)
    assert not model.spec.rope_neox and not model.spec.tie_embeddings
    ref = _check(model, want)
    if rope != "plain":  # the scaling changes the answer: the engine did not ignore it
        unscaled = dataclasses.replace(model.spec, rope=RoPE(theta=10000.0, rot_dim=64))
        assert np.abs(Reference(unscaled, want).forward(PROMPT)[-1] - ref).max() > 1e-2


def test_an_hf_checkpoint_with_llama3_scaling_and_partial_rotary_runs_as_the_reference(tmp_path):
    config = {
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    }
    want = write_hf(tmp_path / "hf", config)
    model = open_model(tmp_path / "hf")
    assert model.spec.rope_neox and model.spec.rope.rot_dim == 32
    assert model.spec.rope.scaling == "llama3"
    _check(model, want)
