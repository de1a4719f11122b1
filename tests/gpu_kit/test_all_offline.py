"""scripts/gpu/all.sh on a machine without a GPU: it runs its set-up steps, skips every check
with the reason `no GPU`, and leaves ONE archive under $OUT holding every log and summary.json.
Its two device calls share the machine: call 1 keeps SmolLM2's part 1, call 2 joins it with
part 2 and refuses a corrupt part. The full offline install from a kit is .ci/run's
scripts/gpu/offline_check.sh (too slow for pytest)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
GPU = REPO / "scripts" / "gpu"
TOOLS = {"all", "kit", "offline_check"}  # scripts/gpu/*.sh that are no checks (helpers: lib/)
# checks that need two GPUs: a lent machine has one, so all.sh runs them in no phase, and the
# README's GPU table says so
MULTI_GPU = {"tp_two_gpus"}

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("nvidia-smi") is not None,
        reason="this machine has a GPU: the checks would run",
    ),
]


def all_sh(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp),
           "OUT": str(tmp / "out"), "PYTHONPATH": str(REPO)}  # fmt: skip
    if os.environ.get("MEDUSA_LIB_DIR"):
        env["MEDUSA_LIB_DIR"] = os.environ["MEDUSA_LIB_DIR"]
    return subprocess.run(["bash", str(GPU / "all.sh"), "--kit", str(tmp / "kit"),
                           "--state", str(tmp / "state"), *args],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


def archive(tmp: Path, phase: str) -> tuple[dict, set[str]]:
    """summary.json and the member names of OUT/medusa-gpu-phase<phase>.tar.gz."""
    with tarfile.open(tmp / "out" / f"medusa-gpu-phase{phase}.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
        summary = json.load(tar.extractfile("./summary.json"))  # type: ignore[arg-type]
    return summary, names


def test_every_check_script_is_a_step_of_all_sh_but_the_two_gpu_ones():
    listed = subprocess.run(["bash", str(GPU / "all.sh"), "--list"], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    steps = {m[1].removesuffix("_smollm2") for m in re.finditer(r"^  (\w+) +\d+$", listed, re.M)}
    checks = {p.stem for p in GPU.glob("*.sh")} - TOOLS
    assert checks - MULTI_GPU <= steps, f"not run by all.sh: {checks - MULTI_GPU - steps}"
    assert MULTI_GPU <= checks and not MULTI_GPU & steps, "a two-GPU check in a one-GPU call"
    table = (REPO / "README.md").read_text()
    for check in MULTI_GPU:
        (row,) = [r for r in table.splitlines() if r.startswith("|") and r.endswith(f"| {check} |")]
        assert "not run (needs 2 GPUs)" in row, row


def test_call_1s_time_bounds_add_up_to_under_8_minutes():
    listed = subprocess.run(["bash", str(GPU / "all.sh"), "--list", "--phase", "1"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    total = int(re.search(r"^  total +(\d+)", listed, re.M)[1])  # type: ignore[index]
    assert total < 8 * 60


@pytest.fixture(scope="module")
def call_1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tmp, model): all.sh --phase 1 ran with a kit that holds a 'model' in two parts."""
    tmp = tmp_path_factory.mktemp("all_sh")
    model = tmp / "SmolLM2.gguf"
    model.write_bytes(os.urandom(2**20 + 7))
    subprocess.run(["bash", str(GPU / "kit.sh"), "split", str(model), str(tmp / "kit")],
                   check=True, capture_output=True)  # fmt: skip
    res = all_sh(tmp, "--phase", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    return tmp, model


def test_without_a_gpu_every_check_is_skipped_and_one_archive_holds_the_logs(call_1):
    tmp, model = call_1
    assert sorted(p.name for p in (tmp / "out").iterdir()) == ["medusa-gpu-phase1.tar.gz"]
    summary, names = archive(tmp, "1")
    rows = {r["check"]: r for r in summary["checks"]}
    checks = [r for r in rows.values() if r["kind"] == "check"]
    assert len(checks) >= 8
    assert all((r["status"], r["reason"]) == ("skipped", "no GPU") for r in checks), checks
    setup = ("stash", "install", "imports", "tiny_model")
    assert [rows[s]["status"] for s in setup] == ["ok"] * 4, rows
    assert (tmp / "state" / "parts" / f"{model.name}.part1").is_file()  # outside $OUT
    assert {"summary.json", "bounds.txt", "imports.log", "tiny_model.log"} <= names
    assert summary["bounds_total_seconds"] < 8 * 60


def test_call_2_joins_the_part_call_1_kept_and_refuses_a_corrupt_one(call_1):
    tmp, model = call_1
    shutil.rmtree(tmp / "kit" / "part1")  # call 2 carries part 2 only
    res = all_sh(tmp, "--phase", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {r["check"]: r for r in archive(tmp, "2")[0]["checks"]}
    assert rows["join"]["status"] == "ok", rows["join"]
    joined = tmp / "state" / "model" / model.name
    assert joined.read_bytes() == model.read_bytes()
    joined.unlink()
    part2 = tmp / "kit" / "part2" / f"{model.name}.part2"
    part2.write_bytes(part2.read_bytes()[:-1] + b"\0")
    res = all_sh(tmp, "--phase", "2")
    assert res.returncode == 1
    rows = {r["check"]: r for r in archive(tmp, "2")[0]["checks"]}
    assert rows["join"]["status"] == "FAILED"
    assert f"{model.name}.part2: corrupt" in rows["join"]["reason"]
    assert not joined.exists()


@pytest.mark.parametrize("check", sorted({p.stem for p in GPU.glob("*.sh")} - TOOLS))
def test_a_check_run_alone_without_the_install_says_what_to_run(tmp_path, check):
    if not Path("/usr/bin/python3").is_file():
        pytest.skip("no /usr/bin/python3 to stand for a bare machine's python")
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").write_text('#!/bin/sh\nexec /usr/bin/python3 -I "$@"\n')
    (bare / "python").chmod(0o755)
    env = {"PATH": f"{bare}:/usr/bin:/bin", "HOME": str(tmp_path), "MODEL": str(tmp_path)}
    res = subprocess.run(["bash", str(GPU / f"{check}.sh")], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode == 3, res.stdout + res.stderr
    assert "run: bash scripts/gpu/all.sh" in res.stderr or "pip install '.[vllm]'" in res.stderr
