"""Graphs of one topology are restored from one template: the first node by node, each later one
from the graph before it with only its differing kernels set anew, or built anew when a fill
differs. Each restored graph computes what its captured graph did."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from medusa.artifact import load_artifact
from medusa.trace import recorder_env
from tests.processes import clean_env, materialize_general

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAM = Path(__file__).parent / "programs" / "shared_template.py"


def test_graphs_of_one_template_compute_what_their_captures_did(tmp_path):
    plain = subprocess.run([sys.executable, str(PROGRAM), "record"], env=clean_env(),
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    sums = plain.stdout.split()
    assert sums[0] == sums[1] != sums[2] == sums[3]  # the fill differs from graph 2 on
    out = tmp_path / "art"
    materialize_general(PROGRAM, out)
    plan = load_artifact(out).plan
    assert len(plan["graphs"]) == 4 and len(plan["templates"]) == 1
    env = recorder_env(tmp_path / "r-%p.mtr", mode="restore", base=clean_env())
    env["MEDUSA_SIM_MEMCHECK"] = "1"
    res = subprocess.run([sys.executable, str(PROGRAM), "restore", str(out)], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == sums
