"""Two engine workers (two processes) on one simulated slice: model A serves a burst and goes idle
while model B surges. With elastic KV and one page ledger, B maps the pages A gives back and gets
well over half the slice; under a static split (same slice, half each) it cannot.

Throughput is B's generated tokens per round, a round being one engine step of each busy worker
(scripts/bench/lockstep.py), not wall time: two loaded cores make wall time noise. The model is a
tiny random Llama whose KV is heavy for its compute (8 layers, 4 KV heads: 256 KiB blocks, 8 to a
page), so the test is about pages, not matmuls."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
from gguf import GGMLQuantizationType as T

from tests.engine.tiny_models import write_gguf

BENCH = Path(__file__).parents[2] / "scripts" / "bench"

SLICE = 12  # pages of 2 MiB: 96 blocks; half is 48, and B's surge needs 80 (10 pages)
SURGE_AT = 2


@pytest.fixture
def lockstep(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(BENCH))  # NOTE: the spawned workers import it from there too
    import lockstep  # scripts/bench/lockstep.py

    yield lockstep
    sys.modules.pop("lockstep", None)


def test_an_idle_models_pages_go_to_a_surging_one(tmp_path, lockstep: ModuleType):
    Load, run_pair = lockstep.Load, lockstep.run_pair
    loads = {
        "A": [Load(count=3, prompt=40, tokens=16)],
        "B": [Load(count=1, prompt=16, tokens=8), Load(count=8, prompt=64, tokens=96, at_round=2)],
    }
    model = tmp_path / "kv-heavy.gguf"
    write_gguf(model, [T.F32], dims={"layers": 8, "kv_heads": 4})
    base = {"model": str(model), "max_model_len": 256, "max_num_seqs": 8,
            "max_num_batched_tokens": 512}  # fmt: skip
    static = run_pair("static", SLICE, loads, base)
    elastic = run_pair("elastic", SLICE, loads, base)
    for t in (*static, *elastic):
        assert not t.errors, t.errors[0]  # no out-of-memory, no failure of any kind
        assert not t.mismatches, t.mismatches[:3]  # the ledger equals the live blocks' pages
    (a, b), (_, b_static) = elastic, static
    idle = a.rounds_busy(0)
    assert idle < SURGE_AT + 30 and a.mapped[idle:] == [0] * (len(a.mapped) - idle)
    assert max(b.mapped) > SLICE // 2  # B's mapped KV grows past half the slice
    surge = loads["B"][1].count * loads["B"][1].tokens
    assert sum(b.tokens[SURGE_AT:]) >= surge and sum(b_static.tokens[SURGE_AT:]) >= surge
    elastic_rate = sum(b.tokens[SURGE_AT:]) / b.rounds_busy(SURGE_AT)
    static_rate = sum(b_static.tokens[SURGE_AT:]) / b_static.rounds_busy(SURGE_AT)
    print(f"B: {elastic_rate:.2f} tokens/round elastic, {static_rate:.2f} static split")
    assert elastic_rate >= 1.5 * static_rate, (elastic_rate, static_rate)
