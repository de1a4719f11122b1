"""Materialize and restore a program that is not the engine: address reuse, a struct holding
pointers, a device-side pointer array saved and relocated, a buffer reached only through it, a
module global, registered host memory, a memset node; device memory holds stale bytes, as on a
GPU."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.artifact import load_artifact
from medusa.trace import recorder_env
from tests.processes import GENERAL, clean_env, materialize_general

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAM = GENERAL


def test_a_general_program_is_materialized_and_restored(tmp_path):
    plain = subprocess.run(
        [sys.executable, str(PROGRAM), "record"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr
    expected, gathered = sum(0.75 * i for i in range(256)), sum(1.25 * i for i in range(256))
    registered = sum(0.5 * i for i in range(256))
    want = (
        f"y {expected:.2f} out {gathered:.2f} bias2 3.00 mapped {gathered:.2f} "
        f"registered {registered:.2f}"
    )
    assert plain.stdout.split() == want.split()
    out = tmp_path / "art"
    materialize_general(PROGRAM, out)
    art = load_artifact(out)
    kinds = art.manifest["relocations"]
    assert kinds["device"] >= 6 and kinds["module global"] == 2 and kinds["vmm"] == 1
    assert kinds["host-mapped"] == 1  # the registered memory
    (content,) = [c for c in art.plan["contents"].values() if c["relocs"]]
    assert len(content["relocs"]) == 3  # the pointer array's three pointers
    # The table reached through the pointers is saved; `reused`, which the graph writes before
    # reading and start-up never wrote, holds only stale bytes and is not.
    (table,) = [i for i, c in art.plan["contents"].items() if not c["relocs"]]
    assert art.plan["contents"][table]["data"][:8] == struct.pack("<2f", 0.0, 0.5)
    script = (
        f"import runpy, sys; sys.argv = ['general', 'restore', {str(out)!r}]; "
        f"runpy.run_path({str(PROGRAM)!r}, run_name='__main__')"
    )
    env_out = _restore(script, tmp_path)
    assert env_out == plain.stdout.strip()


def _restore(script: str, tmp: Path) -> str:
    env = recorder_env(tmp / "r-%p.mtr", mode="restore", base=clean_env())
    env["MEDUSA_SIM_MEMCHECK"] = "1"
    res = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()
