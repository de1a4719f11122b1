"""`medusa simulate --weaving` prints the policy table per profile and refuses unknown ones."""

from __future__ import annotations

import json

from click.testing import CliRunner

from medusa.cli import main


def test_simulate_weaving_prints_each_policy_and_refuses_an_unknown_profile():
    res = CliRunner().invoke(main, ["simulate", "--weaving", "--profiles", "l40s", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    text = json.dumps(out)
    assert "l40s" in text and "dedicated" in text and "multiplexing" in text
    bad = CliRunner().invoke(main, ["simulate", "--weaving", "--profiles", "tpu"])
    assert bad.exit_code == 2 and "unknown ['tpu']" in bad.output
