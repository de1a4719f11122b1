"""The partitioned executor: a decode graph split across two simcuda processes at random
kernel-to-device placements gives the tokens one device gives. A dependency the access analysis
missed would show up as a stale read on one side, and so as a divergence."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from medusa.child import python_module
from medusa.trace import recorder_env
from tests.processes import clean_env

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def pair(tmp: Path, art: Path, trace: Path, *args: str) -> list[dict]:  # type: ignore[type-arg]
    """Both processes of a partition_check; their JSON results."""
    sock = tmp / "exchange.sock"
    procs = []
    for rank in (0, 1):
        env = recorder_env(tmp / f"r{rank}-%p.mtr", mode="restore", base=clean_env())
        cmd = python_module("medusa.tessera.partition_check", str(art), str(trace), str(rank),
                            str(sock), *args)  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))  # fmt: skip
        while rank == 0 and not sock.exists() and procs[0].poll() is None:
            time.sleep(0.05)
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_random_placements_over_two_processes_give_one_devices_tokens(tiny, tmp_path):
    results = pair(tmp_path, *tiny, "--placements", "100")
    for r in results:
        assert r["placements"] == 100 and r["bad"] == [], r["bad"][:3]
        assert all(len(t) == 8 for t in r["reference"][0])
        assert r["segments"] > 5  # placements really alternate between the devices
    assert results[0]["reference"] == results[1]["reference"]


def test_pipelined_request_groups_each_give_one_devices_tokens(tiny, tmp_path):
    """Three request groups in flight, each restored once more in both processes: while one
    waits for the other device's bytes another runs here, and every group's tokens are the ones
    one device gives for its prompts."""
    results = pair(tmp_path, *tiny, "--placements", "8", "--groups", "3")
    for r in results:
        assert r["alone"] and r["placements"] == 8 and r["bad"] == [], r["bad"][:3]
        assert r["interleaved"] > 8  # groups really used the device while others waited
        groups = r["reference"]
        assert len(groups) == 3 and groups[0] != groups[1] != groups[2]
