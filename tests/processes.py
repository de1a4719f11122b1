"""Medusa run as a user runs it, in child processes: `medusa ARGS` in an environment without
MEDUSA_* settings, a restored start under the recorder, and the artifacts the tests make and
spoil. Shared by every test directory (the tests that use them start processes: mark them e2e)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from medusa.env import SIM_RACECHECK, SIM_SCHEDULE_SEED
from medusa.trace import recorder_env

ENGINE_OPTS = [
    "--max-num-batched-tokens",
    "128",
    "--max-model-len",
    "256",
    "--max-num-seqs",
    "4",
    "--gpu-memory-utilization",
    "0.4",
]
CONFIG = {
    "max_num_batched_tokens": 128,
    "max_model_len": 256,
    "max_num_seqs": 4,
    "gpu_memory_utilization": 0.4,
}


def copy_artifact(src: Path, dst: Path) -> Path:
    """A copy of an artifact whose weight store is a hard link (half a GiB each, and a test that
    edits a copy never writes the store): the tests that re-seal or damage the other files."""

    def link_store(s: str, d: str) -> object:
        if Path(s).name == "weights.store":
            os.link(s, d)
            return d
        return shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link_store, symlinks=True)
    return dst


def reseal(art: Path, edit_plan, images: dict[str, bytes] | None = None) -> Path:  # type: ignore[no-untyped-def]
    """Artifact ART with its plan edited in place (and images added), sealed again unsigned:
    what someone who can write artifacts, but not sign them with a trusted key, can make."""
    from medusa.artifact import load_artifact, save_artifact

    a = load_artifact(art)
    edit_plan(a.plan)
    all_images = {p.stem: p.read_bytes() for p in (art / "images").iterdir()} | (images or {})
    drop = ("files", "schema", "medusa_version", "created_unix")
    keep = {k: v for k, v in a.manifest.items() if k not in drop}
    store = art / "weights.store"
    ranks = keep.get("tensor_parallel", {}).get("ranks", [])[1:]  # a tensor-parallel rank's own
    others = [art / r["weights"]["file"] for r in ranks if "weights" in r]
    save_artifact(art, keep, a.plan, all_images, store=store if store.exists() else None,
                  rank_stores=others)  # fmt: skip
    return art


# simcuda's race checking, which the suite turns on (tests/conftest.py): kept in every process a
# test starts, whatever else of MEDUSA_* it clears.
SUITE_SIM = (SIM_RACECHECK.name, SIM_SCHEDULE_SEED.name)


def without_medusa(environ: Mapping[str, str], prefix: str = "MEDUSA_") -> dict[str, str]:
    """environ without its MEDUSA_* (or `prefix`) settings, except the suite's race checking."""
    return {k: v for k, v in environ.items() if not k.startswith(prefix) or k in SUITE_SIM}


def clean_env() -> dict[str, str]:
    """The environment without MEDUSA_* settings, except where the C libraries come from and
    which driver version simcuda plays (so the suite can run as on an older driver)."""
    keep = ("MEDUSA_LIB_DIR", "MEDUSA_SIM_DRIVER_VERSION", *SUITE_SIM)
    return {k: v for k, v in os.environ.items() if not k.startswith("MEDUSA_") or k in keep}


def medusa(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`medusa ARGS` in the clean environment, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "medusa.cli", *args],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


GENERAL = Path(__file__).parent / "materialize" / "programs" / "general.py"


def materialize_general(program: Path, out: Path) -> None:
    """Materializes GENERAL (or a program like it) into OUT."""
    cmd = ["materialize", "--command", "--skip-phase", "graph_capture", "--out", str(out)]
    res = medusa(*cmd, "--", sys.executable, str(program), "record")
    assert res.returncode == 0, res.stderr


def run_restored(
    script: str, tmp: Path, *args: str, memcheck: bool = True, config: dict | None = None
) -> dict:
    """Runs a Python script under the recorder in restore mode (argv: the engine configuration as
    JSON, then ARGS); returns the JSON it prints last."""
    env = recorder_env(tmp / "restore-%p.mtr", mode="restore", base=clean_env())
    if memcheck:
        env["MEDUSA_SIM_MEMCHECK"] = "1"
    res = subprocess.run(
        [sys.executable, "-c", script, json.dumps(config or CONFIG), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def child_running(parent: int, marker: bytes) -> int:
    """The pid of `parent`'s child whose command line holds `marker` (a follower it started)."""
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and marker in cmd:
            return pid
    raise AssertionError(f"no child of {parent} running {marker.decode()}")
