"""The alpha controller moves the right way and holds inside tau; placement refuses an
oversubscribing set naming the demand; prefill chunks meet the TTFT target within memory."""

from __future__ import annotations

import pytest

from medusa.c2c.controller import AlphaController
from medusa.c2c.model import GH200_MIG
from medusa.c2c.scheduler import ModelShape, admit, prefill_chunk, profile_table
from medusa.errors import PlacementError

LLAMA_8B = ModelShape("llama-8b", 4096, 14336, 32, 4096, 1024, tpot_target=0.1)
LLAMA_3B = ModelShape("llama-3b", 3072, 8192, 28, 3072, 1024, tpot_target=0.1)
LLAMA_1B = ModelShape("llama-1b", 2048, 8192, 16, 2048, 512, tpot_target=0.05)


def test_alpha_falls_when_c2c_bound_rises_when_hbm_bound_and_holds_inside_tau():
    c = AlphaController(alpha=0.5, tau=0.05)
    assert c.update(0.9, 0.3, latency=0.2, target=0.1) == pytest.approx(0.3)  # fast step down
    assert c.update(0.9, 0.3, latency=0.05, target=0.1) == pytest.approx(0.25)  # slow step
    h = AlphaController(alpha=0.5)
    assert h.update(0.2, 0.9, latency=0.05, target=0.1) > 0.5
    still = AlphaController(alpha=0.4, tau=0.1)
    for _ in range(5):
        assert still.update(0.52, 0.50, latency=1.0, target=0.1) == 0.4
    lo = AlphaController(alpha=0.1)
    for _ in range(5):
        lo.update(1.0, 0.0, latency=1.0, target=0.1)
    assert lo.alpha == 0.0  # clipped


def test_placement_refuses_a_set_that_oversubscribes_c2c_and_names_the_demand():
    slices = [GH200_MIG["1g.12gb"]] * 7
    copies = [ModelShape(f"llama-8b-{i}", 4096, 14336, 32, 4096, 1024) for i in range(3)]
    with pytest.raises(PlacementError, match=r"C2C demand 4\d\d GB/s .*llama-8b-0 alone 140 GB/s"):
        admit([*copies, LLAMA_3B], slices)


def test_placement_gives_the_heaviest_model_the_fastest_slice():
    slices = [GH200_MIG["1g.24gb"], GH200_MIG["3g.48gb"], GH200_MIG["2g.24gb"]]
    relaxed = [ModelShape(m.name, m.hidden, m.intermediate, m.layers, m.q_size, m.kv_size, 0.5)
               for m in (LLAMA_8B, LLAMA_3B, LLAMA_1B)]  # fmt: skip
    placed = admit(relaxed, slices)
    assert placed["llama-8b"] == 1 and len(set(placed.values())) == 3


def test_prefill_chunk_is_the_smallest_meeting_the_target_within_memory():
    s = GH200_MIG["3g.48gb"]
    table = profile_table(LLAMA_3B, s, prompt=4096, alpha=0.0, c2c_share=450e9 / 3)
    ttfts = [t for _, t, _ in table]
    assert ttfts == sorted(ttfts, reverse=True)  # bigger chunks stream the weights fewer times
    target = (ttfts[2] + ttfts[3]) / 2
    assert prefill_chunk(table, target, hbm_budget=10 << 30) == table[3][0]
    assert prefill_chunk(table, target, hbm_budget=table[1][2]) == table[1][0]
