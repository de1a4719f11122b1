"""`--weights host`: SmolLM2's projection weights stay in host-mapped memory and every projection
runs HybridGEMM; the answers are the device path's and no device memory holds the weights."""

from __future__ import annotations

import pytest

from medusa.cuda import load_backend
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams

PROMPTS = ["What is the capital of France?", "Name a colour."]


def _engine(**kw) -> tuple[LLMEngine, int]:
    b = load_backend()
    free_before, _ = b.mem_get_info()
    e = LLMEngine(
        EngineConfig(
            max_num_seqs=2,
            max_num_batched_tokens=128,
            max_model_len=256,
            kv_cache_memory=32 << 20,
            **kw,
        )
    )
    free_after, _ = b.mem_get_info()
    return e, free_before - free_after


@pytest.fixture(scope="module")
def device_path() -> tuple[list[str], int]:
    """The answers with the weights on the device, and the device memory that engine used."""
    with_device, used_device = _engine()
    try:
        return with_device.generate(PROMPTS, SamplingParams(max_tokens=10), chat=True), used_device
    finally:
        with_device.shutdown()


def test_host_weights_answer_like_device_weights_and_leave_the_device_empty(device_path):
    want, used_device = device_path
    for alpha in (0.0, 1.0):
        host, used_host = _engine(weights="host", alpha=alpha)
        try:
            got = host.generate(PROMPTS, SamplingParams(max_tokens=10), chat=True)
        finally:
            host.shutdown()
        assert got == want
        # weights (540 MB in fp32) moved off the device: only norms, workspace and KV remain
        assert used_device - used_host > 500 << 20


def test_a_tuned_engine_moves_alpha_between_steps_and_answers_the_same(device_path):
    """tune_alpha: C2C's alpha tuner, a step hook medusa.plugins registers, sets the engine's
    alpha after its first interval of steps; the answers do not depend on alpha."""
    from medusa import plugins
    from medusa.c2c.alpha_tuner import AlphaTuner

    plugins.register()
    tuned, _ = _engine(weights="host", alpha=0.5, tune_alpha=True)
    try:
        got = tuned.generate(PROMPTS, SamplingParams(max_tokens=10), chat=True)
        (tuner,) = [h for h in tuned.hooks if isinstance(h, AlphaTuner)]
        alphas = list(tuned.runner.alphas)
    finally:
        tuned.shutdown()
    assert got == device_path[0]
    assert len(tuner.history) >= 1  # 10 steps: an interval of 8 went by
    assert alphas == [tuner.history[0]] * len(alphas)


def test_bad_weight_placement_is_refused():
    with pytest.raises(ValueError, match="weights='hbm': use 'device' or 'host'"):
        EngineConfig(weights="hbm")
    with pytest.raises(ValueError, match="alpha=1.5"):
        EngineConfig(weights="host", alpha=1.5)


def test_the_alpha_tuner_follows_the_utilisations_it_sees():
    from dataclasses import replace

    from medusa.c2c.alpha_tuner import AlphaTuner
    from medusa.c2c.telemetry import ModelTelemetry
    from medusa.engine.loader import open_model

    spec = open_model().spec
    cfg = EngineConfig(weights="host", alpha=0.5, tune_alpha=True, slice_profile="1g.12gb")
    c2c_bound = AlphaTuner(cfg, spec, interval=2)
    c2c_bound.telemetry = ModelTelemetry(c2c_bound.slice, c2c_share=1e6)  # a congested link
    alphas = [0.5] * (spec.num_layers + 1)
    for _ in range(6):
        c2c_bound.observe(4, 0.05, alphas)
    assert c2c_bound.history == sorted(c2c_bound.history, reverse=True) and alphas[0] < 0.5
    hbm_bound = AlphaTuner(cfg, spec, interval=2)
    hbm_bound.telemetry = ModelTelemetry(replace(hbm_bound.slice, hbm_bw=1e6), c2c_share=1e15)
    alphas = [0.5] * (spec.num_layers + 1)
    for _ in range(6):
        hbm_bound.observe(64, 0.05, alphas)
    assert alphas[0] > 0.5
    with pytest.raises(ValueError, match="tune_alpha needs weights='host'"):
        AlphaTuner(EngineConfig(tune_alpha=True), spec)
