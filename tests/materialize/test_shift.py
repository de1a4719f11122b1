"""The second recording's address shift: it must move every allocation (memory freed and handed
out again before it too), a pointer into memory that did not move is refused, and the shift's
own footprint must not change the KV cache the recordings size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from medusa.engine.config import EngineConfig
from medusa.engine.materialize import materialize_engine
from medusa.materialize.analysis import MaterializeError
from medusa.materialize.driver import SHIFT_BYTES, analyze_runs
from medusa.trace import recorder_env
from tests.processes import CONFIG, SUITE_SIM, clean_env

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

GENERAL = Path(__file__).parent / "programs" / "general.py"
REUSE = """
from medusa.cuda import load_backend
b = load_backend("sim")
first = b.malloc(4096)
b.free(first)
print(hex(b.malloc(4096)))  # first's address again
"""


def _record(cmd: list[str], trace: Path, **extra: str) -> str:
    env = recorder_env(trace, base=clean_env())
    env.update(extra)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_memory_reused_before_the_shift_moves_too(tmp_path):
    """Same arena base both times (a GPU's layout is the same every run): only the shift moves."""
    cmd = [sys.executable, "-c", REUSE]
    plain = _record(cmd, tmp_path / "0.mtr", MEDUSA_SIM_SEED="5")
    shifted = _record(
        cmd, tmp_path / "1.mtr", MEDUSA_SIM_SEED="5", MEDUSA_TRACE_SHIFT=str(SHIFT_BYTES)
    )
    assert plain != shifted


def test_a_pointer_into_memory_that_did_not_move_is_refused(tmp_path):
    """Two recordings with nothing shifted: every pointer looks like a constant; refuse."""
    cmd = [sys.executable, str(GENERAL), "record"]
    for run in (0, 1):  # zeroed memory, so that stale bytes do not trip the analysis first
        _record(cmd, tmp_path / f"{run}.mtr", MEDUSA_SIM_SEED="5", MEDUSA_SIM_POISON="0")
    with pytest.raises(MaterializeError, match="same address in both recordings"):
        analyze_runs(tmp_path / "0.mtr", tmp_path / "1.mtr", {"graph_capture"}, lambda _: None)


def test_the_gpu_path_sizes_both_recordings_alike(tmp_path, monkeypatch):
    """The GPU path (shift in the second run, no seeds) on simcuda, where a 2 MiB + 4 KiB block
    takes 4 MiB as on a GPU: the second recording must not size a smaller KV cache."""
    for k in [k for k in list(__import__("os").environ) if k.startswith("MEDUSA_")]:
        if k not in ("MEDUSA_LIB_DIR", *SUITE_SIM):
            monkeypatch.delenv(k)
    summary = materialize_engine(EngineConfig(**CONFIG), tmp_path / "art", "cuda", lambda _: None)
    assert summary["manifest"]["kv"]["num_blocks"] > 0
