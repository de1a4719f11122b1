"""`medusa simulate --sharing`: on a long-tailed, bursty catalog, Prism sustains at least twice the
load of static partitioning at 99% TTFT attainment and more than the MuxServe-like policy, and
needs fewer devices for the load MuxServe-like sustains."""

from __future__ import annotations

import json

from click.testing import CliRunner

from medusa.cli import main
from medusa.prism.catalog import catalog, trace
from medusa.prism.sharing_simulator import attainment


def test_prism_sustains_more_load_on_fewer_devices():
    res = CliRunner().invoke(
        main,
        ["simulate", "--sharing", "--models", "8", "--devices", "4", "--duration", "60", "--json"],
    )
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    prism, mux, static = (r[p] for p in ("prism", "muxserve", "static"))
    assert prism["max_rps"] >= 2 * static["max_rps"] > 0
    assert prism["max_rps"] > mux["max_rps"]
    assert prism["devices"] <= mux["devices"] < static["devices"]


def test_attainment_falls_past_a_policys_maximum_load():
    models = catalog(8, 20.0, seed=0)
    light, heavy = trace(models, 0.2, 60, 0), trace(models, 8.0, 60, 0)
    assert attainment("prism", models, 4, light) >= 0.99
    assert attainment("static", models, 4, heavy) < 0.9
    assert sum(r.ttft == float("inf") for r in heavy) > 0  # some waited past ABANDON


def test_the_table_names_each_policy_and_bad_sizes_are_refused():
    ok = CliRunner().invoke(
        main, ["simulate", "--sharing", "--models", "2", "--devices", "1", "--duration", "20"]
    )
    assert ok.exit_code == 0, ok.output
    assert [line.split()[0] for line in ok.stdout.splitlines()[2:]] == [
        "prism", "muxserve", "static"
    ]  # fmt: skip
    bad = CliRunner().invoke(main, ["simulate", "--sharing", "--devices", "0"])
    assert bad.exit_code == 2 and "--devices must be >= 1" in bad.output
