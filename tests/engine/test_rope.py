"""RoPE frequency tables and scaling, read from config.json and from GGUF metadata, against
formulas written out here as Hugging Face transformers and llama.cpp's converter define them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from medusa.engine.loader import open_model
from medusa.engine.loader.rope import rope_from_config
from medusa.engine.model_error import ModelError
from tests.engine.tiny_models import write_gguf


# ---- transformers' definitions (modeling_rope_utils), in numpy ----
def hf_default(base: float, dim: int) -> np.ndarray:
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def hf_llama3(base, dim, factor, low, high, old_ctx):
    inv = hf_default(base, dim)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, out)


def hf_yarn(base, dim, factor, ctx, beta_fast=32, beta_slow=1, truncate=True):
    def corr_dim(rot):
        return dim * math.log(ctx / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    pos = base ** (np.arange(0, dim, 2) / dim)
    extrapolation = 1 - ramp
    return 1 / (factor * pos) * (1 - extrapolation) + 1 / pos * extrapolation


def hf_mscale(factor, mscale=1.0):
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


CONFIGS = {
    "default": (
        {"rope_theta": 10000.0},
        128,
        hf_default(10000.0, 128),
        1.0,
    ),
    "transformers 5 default": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
        64,
        hf_default(1e6, 64),
        1.0,
    ),
    "linear": (
        {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}},
        64,
        hf_default(10000.0, 64) / 4,
        1.0,
    ),
    "llama 3.1": (
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        128,
        hf_llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192),
        1.0,
    ),  # fmt: skip
    "yarn (qwen)": (
        {
            "rope_theta": 1e6,
            "max_position_embeddings": 131072,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
            },
        },
        128,
        hf_yarn(1e6, 128, 4.0, 32768),
        hf_mscale(4.0),
    ),  # fmt: skip
    "yarn, partial, betas": (
        {
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "max_position_embeddings": 4096,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 16.0,
                "beta_fast": 16,
                "beta_slow": 2,
                "truncate": False,
            },
        },
        128,
        hf_yarn(10000.0, 64, 16.0, 4096, 16, 2, truncate=False),
        hf_mscale(16.0),
    ),  # fmt: skip
    "yarn, deepseek mscale": (
        {
            "rope_theta": 10000.0,
            "rope_scaling": {
                "type": "yarn",
                "factor": 40.0,
                "original_max_position_embeddings": 4096,
                "mscale": 1.0,
                "mscale_all_dim": 0.707,
            },
        },
        64,
        hf_yarn(10000.0, 64, 40.0, 4096),
        hf_mscale(40.0, 1.0) / hf_mscale(40.0, 0.707),
    ),  # fmt: skip
    "yarn, attention_factor": (
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 32.0,
                "original_max_position_embeddings": 4096,
                "attention_factor": 1.25,
            }
        },
        64,
        hf_yarn(150000.0, 64, 32.0, 4096),
        1.25,
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", CONFIGS)
def test_config_rope_gives_transformers_frequencies_and_attention_factor(tmp_path, case):
    cfg, head_dim, want, mscale = CONFIGS[case]
    rope = rope_from_config(cfg, head_dim, tmp_path / "config.json")
    got = rope.inv_freq()
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert rope.mscale == pytest.approx(mscale)


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling.type is 'dynamic'"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
         "rope_parameters.rope_type is 'longrope'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
         "needs the original context length"),
        ({"rope_scaling": {"type": "linear", "factor": "two"}},
         "rope_scaling.factor is 'two', not a float"),
        ({"rope_scaling": "yarn"}, "rope_scaling is 'yarn', not an object"),
    ],
)  # fmt: skip
def test_config_rope_the_engine_cannot_run_is_refused_by_key(tmp_path, cfg, message):
    with pytest.raises(ModelError, match=message) as e:
        rope_from_config(cfg, 64, tmp_path / "config.json")
    assert str(tmp_path / "config.json") in str(e.value)


def llamacpp_rope_freqs(base, dim, factor, low, high, old_ctx):
    """convert_hf_to_gguf.py's rope_freqs.weight for a Llama 3.1 model: a divisor per frequency."""
    divisors = []
    for freq in hf_default(base, dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            divisors.append(1.0)
        elif wavelen > old_ctx / low:
            divisors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(divisors, np.float32)


def test_a_gguf_llama3_file_scales_by_its_rope_freqs_as_transformers_does(tmp_path):
    f = tmp_path / "l3.gguf"
    freqs = llamacpp_rope_freqs(500000.0, 64, 8.0, 1.0, 4.0, 64)
    write_gguf(f, [T.F16], {"rope.freq_base": 500000.0}, {"rope_freqs.weight": freqs})
    rope = open_model(f).spec.rope
    np.testing.assert_allclose(rope.inv_freq(), hf_llama3(500000.0, 64, 8.0, 1.0, 4.0, 64),
                               rtol=1e-6)  # fmt: skip
    assert rope.mscale == 1.0


def test_gguf_yarn_and_dimension_count_are_honoured(tmp_path):
    f = tmp_path / "yarn.gguf"
    meta = {
        "rope.dimension_count": 32,
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 64,
        "rope.scaling.attn_factor": 1.5,
    }
    write_gguf(f, [T.F16], meta)
    rope = open_model(f).spec.rope
    assert rope.rot_dim == 32
    np.testing.assert_allclose(rope.inv_freq(), hf_yarn(10000.0, 32, 4.0, 64), rtol=1e-6)
    assert rope.mscale == pytest.approx(1.5 * hf_mscale(4.0))  # llama.cpp: attn_factor * mscale


def test_gguf_linear_scaling_divides_every_frequency(tmp_path):
    f = tmp_path / "linear.gguf"
    write_gguf(f, [T.F16], {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0})
    np.testing.assert_allclose(
        open_model(f).spec.rope.inv_freq(), hf_default(10000.0, 64) / 2, rtol=1e-6
    )


def test_gguf_rope_the_engine_cannot_run_is_refused_by_key(tmp_path):
    f = tmp_path / "longrope.gguf"
    write_gguf(f, [T.F16], {"rope.scaling.type": "longrope", "rope.scaling.factor": 4.0})
    with pytest.raises(ModelError, match="llama.rope.scaling.type is 'longrope'"):
        open_model(f)
    g = tmp_path / "wide.gguf"
    write_gguf(g, [T.F16], {"rope.dimension_count": 96})
    with pytest.raises(ModelError, match="wide.gguf: tiny: RoPE rotates 96 dims of 64-dim heads"):
        open_model(g)


def test_a_gguf_rope_value_of_the_wrong_type_is_refused_by_key(tmp_path):
    f = tmp_path / "typo.gguf"
    write_gguf(f, [T.F16], {"rope.scaling.type": "linear", "rope.scaling.factor": "2x"})
    with pytest.raises(ModelError, match="llama.rope.scaling.factor is '2x', not a float"):
        open_model(f)
