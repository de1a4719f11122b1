"""The engine on elastic KV: the same tokens as on a static cache, an idle engine holds no page, and
a worker whose device budget is taken by another between steps queues or preempts its own
requests and finishes them once pages come back, never failing a step."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as T

from medusa import plugins
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.prism.ledger import PageLedger
from tests.engine.tiny_models import write_gguf

PAGE = 2 << 20
PROMPTS = [[(5 * i + j) % 250 + 1 for j in range(30 + 7 * i)] for i in range(6)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "kv-heavy.gguf"
    write_gguf(path, [T.F32], dims={"layers": 8, "kv_heads": 4})  # 256 KiB blocks, 8 a page
    return str(path)


def engine(model, kv_memory, **kw):
    plugins.register()  # kv_memory="elastic"
    cfg = EngineConfig(model=model, max_model_len=256, max_num_seqs=4, kv_memory=kv_memory,
                       kv_cache_memory=16 * PAGE, **kw)  # fmt: skip
    return LLMEngine(cfg)


def run(e, max_tokens=40):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    seqs = [e.add_request(p, params) for p in PROMPTS]
    while e.has_unfinished():
        e.step()
    return [s.completion_ids for s in seqs]


def test_elastic_gives_the_static_tokens_and_an_idle_engine_holds_no_page(model):
    with engine(model, "static") as e:
        want = run(e)
    with engine(model, "elastic") as e:
        assert e.blocks.pool.num_held == 0  # nothing mapped before a request
        assert run(e) == want
        assert e.blocks.pool.num_held == 0 and e.blocks.pages_in_use() == 0
        e.runner.probe(1)  # a probe borrows a block and gives its page back
        assert e.blocks.pool.num_held == 0


def test_a_worker_whose_pages_another_takes_queues_and_finishes(model, tmp_path, monkeypatch):
    with engine(model, "static") as e:
        want = run(e)
    path = tmp_path / "ledger"
    PageLedger.create(path, 8, PAGE)
    monkeypatch.setenv("MEDUSA_KV_LEDGER", str(path))
    other = PageLedger(path)
    other.join("other")
    with engine(model, "elastic") as e:
        assert other.try_acquire(8)  # another worker holds the whole device budget
        params = SamplingParams(max_tokens=40, ignore_eos=True)
        seqs = [e.add_request(p, params) for p in PROMPTS]
        for _ in range(5):  # no page to be had: the requests wait, no step fails
            assert e.step() == [] and e.has_unfinished()
        other.release(3)  # three pages free up: less than the four running sequences need
        batches = []
        for _ in range(80):
            batches.append(len(e.step()))
            assert e.blocks.pool.num_held <= 3  # never past the ledger
        assert 0 < min(batches) < 4  # it ran fewer at a time, preempting its own requests
        other.release(5)
        while e.has_unfinished():
            e.step()
        assert [s.completion_ids for s in seqs] == want
        assert PageLedger(path).free() == 8  # the idle engine gave every page back
