"""Materialize and restore a graph that reads weights from a read-only file mapping registered for
the device: restore, in a process where the mapping lies elsewhere, relocates the graph's pointers
into the registration (and at an offset inside it) like any host-mapped allocation."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.artifact import load_artifact
from medusa.trace import recorder_env
from tests.processes import clean_env, medusa

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAM = Path(__file__).parent / "programs" / "registered_weights.py"
N, SKIP = 1024, 16


def _run(*args: str, env: dict[str, str]) -> list[str]:
    res = subprocess.run(
        [sys.executable, str(PROGRAM), *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_a_graph_reading_registered_weights_is_restored_at_another_address(tmp_path):
    weights = tmp_path / "weights.bin"
    weights.write_bytes(struct.pack(f"{N}f", *[0.5 * i for i in range(N)]))
    at, sums = _run("record", str(weights), env=clean_env())
    want = f"out {N + sum(0.5 * i for i in range(N)):.2f} "
    want += f"tail {N - SKIP + sum(0.5 * i for i in range(SKIP, N)):.2f}"
    assert sums == want
    out = tmp_path / "art"
    cmd = ["materialize", "--command", "--skip-phase", "graph_capture", "--out", str(out)]
    res = medusa(*cmd, "--", sys.executable, str(PROGRAM), "record", str(weights))
    assert res.returncode == 0, res.stderr
    art = load_artifact(out)
    assert art.manifest["relocations"]["host-mapped"] == 2
    env = recorder_env(tmp_path / "r-%p.mtr", mode="restore", base=clean_env())
    env["MEDUSA_SIM_MEMCHECK"] = "1"
    restored_at, restored = _run("restore", str(weights), str(out), env=env)
    assert restored == sums
    assert restored_at != at  # the registration moved; the graph followed it


def test_a_registration_in_a_phase_the_restore_skips_is_refused(tmp_path):
    # the restore would replay it as an empty pinned buffer: the graph would read no weights
    weights = tmp_path / "weights.bin"
    weights.write_bytes(struct.pack(f"{N}f", *[0.5 * i for i in range(N)]))
    cmd = ["materialize", "--command", "--skip-phase", "graph_capture", "--skip-phase", "setup"]
    res = medusa(*cmd, "--out", str(tmp_path / "art"), "--", sys.executable, str(PROGRAM),
                 "record", str(weights))  # fmt: skip
    assert res.returncode != 0
    assert "registered (cudaHostRegister) in skipped phase 'setup'" in res.stderr
    assert not (tmp_path / "art").exists()
