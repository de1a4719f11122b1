"""Issue 30, finding 2: the tasks a receiver runs come from the sender, through the region. Tasks
with a far layer, more sequences or rows than the region holds, query starts past its rows, a
sequence twice, rows that skip tokens, an unknown kind: each is refused with its reason before
anything is written to device memory; the receiving worker keeps its answers and its health, and
then serves a good task. An exception in the receiver's idle poll fails /health and the
requests, as a failed step does (it used to kill the engine thread, /health staying 200)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from medusa.engine.config import EngineConfig
from medusa.engine.step_hooks import StepHook
from medusa.serve.api_server import create_app
from medusa.serve.async_engine import AsyncEngine
from medusa.weaver.region import APPEND, ATTEND, FETCH, RELEASE, ExchangeRegion, Geometry
from medusa.weaver.sender import WeaverSender
from tests.security._shm import post_task, private_dir, start_worker, tiny_model

TOKEN = "the-gateways-token"
GEO = Geometry(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, max_seqs=4, max_tokens=32)


def _rows(region: ExchangeRegion, ids: list[int], lens: list[int], qs: list[int]) -> None:
    region.array("seq_ids")[: len(ids)] = ids
    region.array("seq_lens")[: len(lens)] = lens
    region.array("query_start")[: len(qs)] = qs


BAD = [  # (what the sender wrote: head, and sequences, lengths, query starts), what is said
    ((ATTEND, 1_000_000, 1, 1), ([1], [1], [0, 1]), "task layer 1000000"),
    ((ATTEND, -1, 1, 1), ([1], [1], [0, 1]), "task layer -1"),
    ((ATTEND, 0, 5, 5), ([1, 2, 3, 4], [1] * 4, [0, 1, 2, 3, 4]), "task of 5 sequences"),
    ((APPEND, 0, 0, 0), ([], [], [0]), "task of 0 sequences"),
    ((APPEND, 0, 1, 33), ([1], [33], [0, 33]), "task of 33 rows"),
    ((ATTEND, 0, 1, 1), ([1], [1], [0, 100_000]), "query starts"),
    ((ATTEND, 0, 2, 2), ([1, 1], [1, 1], [0, 1, 2]), "given twice"),
    ((ATTEND, 0, 1, 1), ([1], [2**31 - 1], [0, 1]), "1 rows to reach 2147483647 tokens"),
    ((ATTEND, 0, 2, 2), ([1, 2], [1, 1], [0, 2, 2]), "2 rows to reach 1 tokens"),
    ((FETCH, 0, 1, 0), ([9], [0], [0]), "sequence 9 is not held"),
    ((FETCH, 0, 2, 0), ([9, 8], [0, 0], [0]), "task of 2 sequences"),
    ((RELEASE, 0, 9, 0), ([1], [0], [0]), "task of 9 sequences"),
    ((99, 0, 1, 1), ([1], [1], [0, 1]), "task kind 99 is unknown"),
]


@pytest.mark.e2e
def test_bad_tasks_are_refused_before_they_touch_device_memory(
    tmp_path: Path, shm_path: Path
) -> None:
    model = tiny_model(tmp_path / "tiny.gguf")
    regions = private_dir(shm_path)  # on tmpfs, as a gateway's (tests/conftest.py says why)
    w = start_worker(model, token=TOKEN, weaving_dir=regions)
    region = ExchangeRegion.create(regions / "weaver-1", GEO)  # the (hostile) sender's
    try:
        want = w.answer()
        r = w.post("/weaving/receive", {"region": "weaver-1", "blocks": 16})
        assert r.status_code == 200, r.text
        for head, rows, says in BAD:
            _rows(region, *rows)
            assert says in post_task(region, head), (head, rows)
            assert w.answer() == want  # its own model, weights and KV untouched
        state = w.get("/weaving").json()["receiving"]
        assert state["held"] == 0 and w.get("/health").status_code == 200
        # a good task still runs: one token of a new sequence, attention over it
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((1, n), np.float32) for n in (64, 32, 32))
        out = WeaverSender(region).attend(0, [7], [1], q, k, v)
        # one key: each head's output is its KV head's value (4 heads on 2 KV heads)
        assert np.allclose(out.reshape(4, 16), np.repeat(v.reshape(2, 16), 2, axis=0))
        assert w.post("/weaving/unpair", {}).status_code == 200
        assert w.answer() == want and w.get("/health").status_code == 200
    finally:
        region.close()
        w.stop()


class _FailingReceiver(StepHook):
    """A receiver whose idle poll fails as a device fault would (cudaErrorIllegalAddress)."""

    @property
    def polls_when_idle(self) -> bool:
        return True

    def poll_idle(self) -> None:
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access")


def test_a_receiver_whose_idle_poll_fails_fails_health_and_requests(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny.gguf")
    config = EngineConfig(model=str(model), max_num_seqs=4, max_model_len=128,
                          max_num_batched_tokens=128, kv_cache_memory=4 << 20)  # fmt: skip
    engine = AsyncEngine(config)
    engine.start()
    client = TestClient(create_app(engine, "tiny", token=""))
    try:
        assert engine.ready.wait(120) and client.get("/health").status_code == 200
        assert engine.engine is not None  # as /weaving/receive installs a receiver:
        engine.engine.add_hook(_FailingReceiver())
        deadline = time.monotonic() + 30
        while client.get("/health").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        health = client.get("/health")
        assert health.status_code == 500, health.text
        assert "serving a Weaver region failed" in health.json()["error"]
        assert "cudaErrorIllegalAddress" in health.json()["error"]
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 4}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 503 and "cudaErrorIllegalAddress" in r.json()["error"]["message"]
    finally:
        engine.shutdown()
