"""A recorded vLLM start-up is several processes; the engine core's trace is the one that holds
the graph capture, whichever process touched the device first. On simcuda, with a program shaped
like a vLLM start-up that first runs a helper process on the device. (No vLLM needed.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from medusa.integrations.vllm.traces import engine_core_trace, process_traces, trace_pattern
from medusa.materialize.analysis import MaterializeError
from medusa.trace import read_trace, recorder_env
from medusa.trace.format import Ev
from tests.processes import clean_env

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAM = Path(__file__).parent / "programs" / "vllm_like.py"
ROOT = Path(__file__).parents[2]


def record(work: Path, trace: Path) -> None:
    env = recorder_env(trace, base={**clean_env(), "PYTHONPATH": str(ROOT)})
    cmd = [sys.executable, str(PROGRAM), "record", str(work / "side.json"), "helper-first"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def captures(path: Path) -> int:
    return int((read_trace(path).records["type"] == Ev.CAPTURE_BEGIN).sum())


def test_each_process_records_and_the_engine_cores_trace_is_picked_by_content(tmp_path):
    record(tmp_path, trace_pattern(tmp_path, "0"))
    traces = process_traces(tmp_path, "0")
    assert len(traces) == 2  # the helper's and the start-up's
    picked = engine_core_trace(traces)
    assert captures(picked) == 2
    (helper,) = set(traces) - {picked}
    assert captures(helper) == 0 and len(read_trace(helper).records) > 0
    assert engine_core_trace(list(reversed(traces))) == picked  # by content, not by order


def test_one_trace_name_for_all_processes_loses_the_engine_core(tmp_path):
    # The helper takes the file; the start-up finds the name taken and stops recording.
    record(tmp_path, tmp_path / "0-shared.mtr")
    traces = process_traces(tmp_path, "0")
    assert len(traces) == 1 and captures(traces[0]) == 0
    with pytest.raises(MaterializeError, match="no process recorded vLLM's graph capture"):
        engine_core_trace(traces)
