"""Two start-ups with the same configuration allocate the same sizes in the same order, phase by
phase (what restoring one from a recording of the other relies on), at different addresses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from medusa.trace import Ev, read_trace, recorder_env
from medusa.trace import records as R
from tests.processes import without_medusa

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

START = """
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
LLMEngine(EngineConfig(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=256))
"""


def _record(path, seed: str):
    env = recorder_env(path, base=without_medusa(os.environ))
    env["MEDUSA_SIM_SEED"] = seed
    res = subprocess.run(
        [sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    return read_trace(path)


def _shape(trace):
    out = []
    for e in trace.events(Ev.ALLOC, Ev.FREE, Ev.MARK):
        if isinstance(e, R.Mark):
            out.append(("mark", e.phase))
        elif isinstance(e, R.Alloc):
            out.append(("alloc", e.api, e.size))
        else:
            out.append(("free", e.api, e.size))
    return out


def test_allocation_order_is_the_same_in_every_start_up(tmp_path):
    a = _record(tmp_path / "a.mtr", "1")
    b = _record(tmp_path / "b.mtr", "2")
    shape_a, shape_b = _shape(a), _shape(b)
    marks = [x[1] for x in shape_a if x[0] == "mark"]
    assert marks == [
        "runtime_init",
        "weights_alloc",
        "weights_load",
        "tokenizer",
        "workspace",
        "kv_profile",
        "kv_alloc",
        "graph_capture",
        "ready",
    ]
    assert len([x for x in shape_a if x[0] == "alloc"]) > 200  # one per weight, at least
    assert shape_a == shape_b
    addrs_a = [e.addr for e in a.of(R.Alloc, Ev.ALLOC)]
    addrs_b = [e.addr for e in b.of(R.Alloc, Ev.ALLOC)]
    assert addrs_a != addrs_b  # a different arena base: only the order and sizes are stable
