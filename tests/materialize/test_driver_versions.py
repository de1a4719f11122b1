"""Materialize and restore on an older driver (MEDUSA_SIM_DRIVER_VERSION): a 12.4 driver works
through cuFuncGetParamInfo; a 12.3 one cannot tell kernel parameter layouts, and materialize
refuses, naming the driver version, instead of writing an artifact that cannot restore."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from medusa.trace import recorder_env
from tests.processes import clean_env

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAM = Path(__file__).parent / "programs" / "general.py"


def _env(version: str) -> dict[str, str]:
    return {**clean_env(), "MEDUSA_SIM_DRIVER_VERSION": version}


def _materialize(out: Path, version: str) -> subprocess.CompletedProcess[str]:
    cmd = ["materialize", "--command", "--skip-phase", "graph_capture", "--out", str(out)]
    return subprocess.run(
        [sys.executable, "-m", "medusa.cli", *cmd, "--", sys.executable, str(PROGRAM), "record"],
        env=_env(version),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_12_3_driver_is_refused_naming_its_version(tmp_path):
    res = _materialize(tmp_path / "art", "12030")
    assert res.returncode != 0
    assert "the recorder stopped early" in res.stderr
    assert "the driver (CUDA 12.3) has neither cuFuncGetParamInfo nor cuKernelGetParamInfo" in (
        res.stderr
    )
    assert not (tmp_path / "art").exists()


def test_a_12_4_driver_materializes_and_restores_bit_identically(tmp_path):
    plain = subprocess.run(
        [sys.executable, str(PROGRAM), "record"],
        env=_env("12040"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr
    out = tmp_path / "art"
    res = _materialize(out, "12040")
    assert res.returncode == 0, res.stderr
    env = recorder_env(tmp_path / "r-%p.mtr", mode="restore", base=_env("12040"))
    env["MEDUSA_SIM_MEMCHECK"] = "1"
    # NOTE: through runpy, so that this checkout's medusa is the one imported
    script = (
        f"import runpy, sys; sys.argv = ['general', 'restore', {str(out)!r}]; "
        f"runpy.run_path({str(PROGRAM)!r}, run_name='__main__')"
    )
    restored = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.strip() == plain.stdout.strip()
