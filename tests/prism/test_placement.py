"""KV-pressure placement: urgent models spread out, a placed model stays unless moving clearly
helps, and eviction drops idle models with the loosest SLO first."""

from __future__ import annotations

import pytest

from medusa.errors import PlacementError
from medusa.prism.placement import ModelLoad, evict, kvpr, place

GiB = 2**30


def test_urgent_models_spread_over_devices_by_kv_pressure():
    hot = [ModelLoad(f"hot{i}", 10 * GiB, rate=10, slo=1) for i in range(2)]
    cold = [ModelLoad(f"cold{i}", 10 * GiB, rate=0.1, slo=1) for i in range(4)]
    where = place(hot + cold, [80 * GiB, 80 * GiB])
    assert where["hot0"] != where["hot1"]  # each hot model gets a device's KV to itself
    per = [sum(1 for v in where.values() if v == d) for d in (0, 1)]
    assert per == [3, 3]
    on0 = [m for m in hot + cold if where[m.name] == 0]
    assert kvpr(on0, 80 * GiB) == pytest.approx((10 + 0.2) / (50 * GiB))


def test_a_model_that_fits_nowhere_is_refused_with_its_name():
    with pytest.raises(PlacementError, match="'big'.*fits on no device"):
        place([ModelLoad("big", 90 * GiB, 1, 1)], [80 * GiB])


def test_a_placed_model_moves_only_when_the_gain_passes_the_threshold():
    y, x, c = (ModelLoad(n, 10 * GiB, r, 1) for n, r in (("y", 1.1), ("x", 1.0), ("c", 0.1)))
    assert place([y, x, c], [80 * GiB, 80 * GiB]) == {"y": 0, "x": 1, "c": 1}
    # c already sits next to y: moving it would lower its pressure by 8%, so it stays ...
    assert place([y, x, c], [80 * GiB, 80 * GiB], current={"c": 0})["c"] == 0
    # ... but next to an urgent model (pressure 6x what it would see elsewhere) it moves
    hot = ModelLoad("y", 10 * GiB, 10, 1)
    assert place([hot, x, c], [80 * GiB, 80 * GiB], current={"c": 0})["c"] == 1


def test_eviction_drops_idle_models_with_the_loosest_slo_first():
    ms = [
        ModelLoad("tight", 10 * GiB, 1, slo=0.5),
        ModelLoad("loose", 10 * GiB, 1, slo=5),
        ModelLoad("busy", 10 * GiB, 1, slo=9),
    ]
    assert evict(ms, {"tight", "loose"}, 40 * GiB, 5 * GiB) == []
    assert evict(ms, {"tight", "loose"}, 40 * GiB, 15 * GiB) == ["loose"]
    assert evict(ms, {"tight", "loose"}, 40 * GiB, 25 * GiB) == ["loose", "tight"]
    with pytest.raises(PlacementError, match="do not fit even with every idle model"):
        evict(ms, {"tight", "loose"}, 40 * GiB, 35 * GiB)
