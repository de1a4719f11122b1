"""The reference engine on simcuda with SmolLM2: numerics against an independent numpy forward,
greedy text, graph replay against eager decode, sampling, stop conditions, bad input."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.loader import open_model
from medusa.engine.sampling import SamplingParams
from medusa.engine.sequence import Sequence
from tests.engine.reference import Reference

# Runs the whole engine on SmolLM2 (tens of seconds a test on 2 cores): e2e, not in the fast
# subset, though it starts no process (see pyproject.toml's e2e marker).
pytestmark = pytest.mark.e2e

CHAT = "What is the capital of France?"


@pytest.fixture(scope="module")
def source():
    return open_model()


@pytest.fixture(scope="module")
def engine(source):
    # Half the device, so that a second engine fits beside it.
    cfg = EngineConfig(
        max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512, gpu_memory_utilization=0.45
    )
    e = LLMEngine(cfg, source=source)
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def eager(source):
    """An engine that decodes eagerly: what the graphs' tokens are compared with."""
    cfg = EngineConfig(
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
        enforce_eager=True,
        kv_cache_memory=64 << 20,
    )
    with LLMEngine(cfg, source=source) as e:
        yield e


@pytest.fixture(scope="module")
def reference(source):
    return Reference(source.spec, dict(source.weights()))


def test_prefill_logits_match_an_independent_numpy_forward(engine, source):
    tok = engine.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": CHAT}]))
    seq = Sequence(ids, SamplingParams(), seed=0)
    seq.chunk = len(ids)
    engine.blocks.allocate(seq)
    try:
        engine.runner.execute([seq], is_prefill=True)
        got = engine.runner.last_logits(1)[0]
    finally:
        engine.blocks.deallocate(seq)
    want = Reference(source.spec, dict(source.weights())).forward(ids)[-1]
    assert got.shape == (source.spec.vocab_size,)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    assert int(np.argmax(got)) == int(np.argmax(want))


def test_greedy_chat_answer_matches_the_reference_token_for_token(engine, reference):
    tok = engine.tokenizer
    (text,) = engine.generate([CHAT], SamplingParams(max_tokens=12), chat=True)
    assert "Paris" in text
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": CHAT}]))
    want = reference.greedy(ids, 12, set(tok.eos_ids))
    assert tok.decode([t for t in want if t not in tok.eos_ids]) == text


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_graph_replayed_decode_gives_the_tokens_eager_decode_gives(engine, eager, batch):
    prompts = [f"Count from {i} to {i + 5}:" for i in range(batch)]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    graphed = engine.generate(prompts, params)
    assert engine.runner.graphs, "the engine captured no decode graphs"
    assert not eager.runner.graphs
    assert eager.generate(prompts, params) == graphed


def test_seeded_sampling_repeats_and_differs_by_seed(engine):
    p = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=1234, ignore_eos=True)
    a = engine.generate(["Once upon a time"], p)
    b = engine.generate(["Once upon a time"], p)
    c = engine.generate(
        ["Once upon a time"],
        SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=99, ignore_eos=True),
    )
    assert a == b and a != c


def test_stop_strings_and_max_tokens_end_a_completion(engine):
    (full,) = engine.generate([CHAT], SamplingParams(max_tokens=12), chat=True)
    word = full.split()[2]
    (cut,) = engine.generate([CHAT], SamplingParams(max_tokens=12, stop=(word,)), chat=True)
    assert cut == full[: full.index(word)]
    seqs = []
    engine.generate(
        ["Hello"],
        SamplingParams(max_tokens=3, ignore_eos=True),
        on_step=lambda outs: seqs.extend(o.seq for o in outs if o.finished),
    )
    assert seqs[0].num_completion_tokens == 3 and seqs[0].finish_reason == "length"


def test_a_too_long_prompt_is_refused_with_the_limit(engine):
    with pytest.raises(ValueError, match=r"at most 255 .*: start it with --max-prefill-chunk 256"):
        engine.add_request(list(range(300)), SamplingParams())


def test_chunked_prefill_gives_the_whole_prefills_answer(engine, source):
    prompts = [CHAT, "Name three colours.", "Write one sentence about the sea."]
    params = SamplingParams(max_tokens=12)
    whole = engine.generate(prompts, params, chat=True)
    cfg = EngineConfig(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=512,
        max_prefill_chunk=16,
        kv_cache_memory=64 << 20,
    )
    with LLMEngine(cfg, source=source) as chunked:
        assert chunked.max_prompt_tokens == 511  # longer than one step's budget: chunks
        assert chunked.generate(prompts, params, chat=True) == whole
        # The start-up ran without the collector and froze what it built; the collector is on
        # again for serving, and a shut-down engine's objects can be collected again.
        assert gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
