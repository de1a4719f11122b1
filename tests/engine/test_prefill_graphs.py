"""Prefill graphs on the tiny Llama and Qwen2 models, in this process: prefill and chunked
prefill steps replay them (their tokens padded to a bucket) and sample what eager prefill does;
the setting's default and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from medusa.engine.config import EngineConfig, default_prefill_sizes
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.loader import open_model
from medusa.engine.sampling import SamplingParams
from tests.engine.tiny_models import write_hf, write_qwen2

CONFIG = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 256,
          "kv_cache_memory": 16 << 20, "max_prefill_chunk": 48}  # fmt: skip
# 150 and 230 tokens: longer than a step (64), prefilled in chunks of 48 beside other prompts
LENGTHS = (5, 20, 40, 150, 230)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def source(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "model"
    (write_hf(path, {}) if request.param == "llama" else write_qwen2(path))
    return open_model(path)


def completions(source, **settings) -> tuple[list[list[int]], list[int], dict[str, int]]:
    """The greedy completions of LENGTHS' prompts, the prefill graphs' buckets, and the prefill
    steps by how they ran."""
    rng = np.random.default_rng(1)
    prompts = [[int(x) for x in rng.integers(1, 250, n)] for n in LENGTHS]
    with LLMEngine(EngineConfig(**{**CONFIG, **settings}), source=source) as e:
        seqs = [e.add_request(p, SamplingParams(max_tokens=8)) for p in prompts]
        while e.has_unfinished():
            e.step()
        return [s.completion_ids for s in seqs], sorted(e.runner.prefill.graphs), e.prefill_steps


def test_prefill_graphs_sample_what_eager_prefill_samples(source):
    eager, none, _ = completions(source, prefill_graph_sizes=())
    graphs, buckets, steps = completions(source, prefill_graph_sizes=(16, 32, 64))
    assert none == [] and buckets == [16, 32, 64] and steps["graph"] >= 4
    assert graphs == eager
    assert completions(source)[1] == [64]  # the default: max_num_batched_tokens, here


def test_a_step_replays_a_bucket_only_where_padding_at_most_doubles_its_tokens(source):
    """Buckets 16 and 64: 8 tokens pad to 16, 20 would pad to 64 (3.2x) and run eagerly."""
    ran = []
    with LLMEngine(EngineConfig(**CONFIG, prefill_graph_sizes=(16, 64)), source=source) as e:
        for n in (1, 8, 9, 16, 20, 31, 32, 64):
            before = dict(e.prefill_steps)
            e.add_request(list(range(10, 10 + n)), SamplingParams(max_tokens=1))
            while e.has_unfinished():
                e.step()
            ran.append(next(k for k in before if e.prefill_steps[k] != before[k]))
    assert ran == ["eager", "graph", "graph", "graph", "eager", "eager", "graph", "graph"]


def test_a_probe_of_each_bucket_replays_as_eager_execution_runs(source):
    with LLMEngine(EngineConfig(**CONFIG, prefill_graph_sizes=(16, 48)), source=source) as e:
        for tokens in (16, 48):
            sampled, logits = e.runner.prefill.probe(tokens)
            assert np.array_equal(sampled[0], sampled[1])
            assert np.array_equal(logits[0], logits[1]) and np.isfinite(logits).all()


def test_default_buckets_and_refused_ones():
    assert default_prefill_sizes(512) == (64, 128, 256, 512)
    assert default_prefill_sizes(100) == (64, 100) and default_prefill_sizes(32) == (32,)
    assert EngineConfig(max_num_seqs=1, max_model_len=40).prefill_sizes == (40,)
    assert EngineConfig(enforce_eager=True).prefill_sizes == ()
    with pytest.raises(ValueError, match=r"prefill_graph_sizes \[600\]: each must be in 1..512"):
        EngineConfig(prefill_graph_sizes=(64, 600))


def test_an_upload_larger_than_its_buffer_is_refused_and_writes_nothing():
    """A bucket beyond the workspace would copy past a buffer: on a GPU that overwrites whatever
    lies next to it, silently, so the engine's upload checks the size first."""
    from medusa.engine.device import Device

    d = Device()
    small, neighbour = d.alloc(16), d.alloc(16)
    d.upload(neighbour, np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match="upload of 32 bytes into a buffer of 16"):
        d.upload(small, np.zeros(8, dtype=np.float32))
    assert d.download(neighbour, np.float32, 4).tolist() == [0.0, 1.0, 2.0, 3.0]
