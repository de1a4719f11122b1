from __future__ import annotations

import subprocess
import sys

import pytest

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def test_doctor_reports_the_sim_back_end_and_runs_a_kernel():
    res = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "doctor", "--device", "sim"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"MEDUSA_SIM_MEMORY": "12G", "MEDUSA_SIM_SMS": "26", "PATH": "/usr/bin"},
    )
    assert res.returncode == 0, res.stderr
    assert "back-end        sim" in res.stdout
    assert "12.0 GiB total" in res.stdout  # a 1g.24gb-like slice, configured from the environment
    assert "SMs           26" in res.stdout
    assert "smoke kernel    ok" in res.stdout


def test_doctor_refuses_an_unknown_device_clearly():
    res = subprocess.run(
        [sys.executable, "-m", "medusa.cli", "doctor", "--device", "tpu"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode != 0
    assert "tpu" in res.stderr
