# ruff: noqa: F811 - the fixtures come from tests.security._store
"""Finding 15: a full disk ended materialize with a raw OSError (or, when the recordings filled
it, a JSON error from a sidecar cut short), and a kernel reading a host mapping cut short was
reported as one that "wrote" to read-only memory. Now a full disk is named, with the space
needed, and nothing is left behind; the fault says what happened."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import lines
from tests.processes import clean_env
from tests.security._store import tiny_model  # noqa: F401 - fixtures
from tests.weights.conftest import OPTS

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def _on_a_small_disk(size: str, command: list[str], disk: Path) -> subprocess.CompletedProcess[str]:
    """`command` run with a tmpfs of `size` mounted at `disk` (a mount namespace of its own, as
    an unprivileged user may make one); skips where none can be made."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a small file system")
    disk.mkdir()
    at = shlex.quote(str(disk))
    script = (f"mount -t tmpfs -o size={size} tmpfs {at} || exit 99; "
              f"{shlex.join(command)}; rc=$?; ls -A {at}; exit $rc")  # fmt: skip
    res = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                         env=clean_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    if res.returncode == 99 or "unshare failed" in res.stderr:
        pytest.skip(f"cannot mount a small file system here: {res.stderr[-300:]}")
    return res


def _materialize(model: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "medusa.cli", "materialize", str(model), *OPTS, "--out", str(out)]


def test_a_full_disk_for_the_artifact_is_named_with_the_space_needed(tiny_model, tmp_path):
    disk = tmp_path / "disk"
    res = _on_a_small_disk("2m", _materialize(tiny_model, disk / "art"), disk)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert f"Error: {disk}/.art.weights." in res.stderr
    assert "no space left for the weight store (10 MiB needed, 2 MiB free)" in res.stderr
    assert res.stdout.strip() == ""  # nothing left on the disk


def test_a_full_disk_for_the_recordings_is_named(tiny_model, tmp_path):
    disk = tmp_path / "disk"
    cmd = ["env", f"TMPDIR={disk}", *_materialize(tiny_model, tmp_path / "art")]
    res = _on_a_small_disk("16k", cmd, disk)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert f"Error: {disk}: no space left for the recordings" in res.stderr
    assert res.stdout.strip() == ""
    assert not (tmp_path / "art").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["disk"]  # nor the store beside the target


def test_a_kernel_reading_a_host_mapping_cut_short_is_not_said_to_write(cprog, run):
    res = run(cprog("host_register"), "read-cut-short", env={"MEDUSA_SIM_VERBOSE": "1"})
    assert lines(res.stdout)["read kernel"] == "cudaErrorIllegalAddress"
    assert "kernel vector_add faulted at" in res.stderr
    assert "no page behind it (SIGBUS: the file mapped there was cut short" in res.stderr
    assert "wrote" not in res.stderr
