"""scripts/gpu/all.sh, the one command for every GPU check: it parses, and on a machine without a
GPU it runs nothing and still prints its summary table, every check skipped with the reason."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

GPU = Path(__file__).parents[2] / "scripts" / "gpu"
# The checks all.sh runs: its CHECKS=(...) array.
CHECKS = re.search(r"^CHECKS=\(([^)]*)\)", (GPU / "all.sh").read_text(), re.M).group(1).split()  # type: ignore[union-attr]


def test_every_gpu_script_parses():
    for script in sorted([*GPU.glob("*.sh"), *GPU.glob("lib/*.sh")]):
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, f"{script.name}: {res.stderr}"


def test_all_runs_every_check_listed_there():
    assert sorted(p.stem for p in GPU.glob("*.sh") if p.stem != "all") == sorted(CHECKS)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_without_a_gpu_every_check_is_skipped_in_the_table(tmp_path):
    res = subprocess.run(
        ["bash", str(GPU / "all.sh")],
        env={"PATH": "/usr/bin:/bin", "MEDUSA_GPU_LOGS": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    assert rows["check"].split() == ["check", "status", "seconds", "figure"]
    for check in CHECKS:
        assert rows[check].split()[1:] == ["skipped:", "no", "GPU", "-"], rows[check]
