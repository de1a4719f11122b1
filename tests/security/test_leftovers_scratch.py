# ruff: noqa: F811 - the fixtures come from tests.security._store
"""Finding 15: what stopped processes left in shared directories. `medusa run --artifact`
stopped by SIGTERM (what the gateway sends) left its restore trace directory, a SIGKILLed
materialize its recordings and the weight store it was writing beside the target. Now a worker
removes its trace directory once started, and on SIGTERM; what a killed process left is removed
by the next one that makes such a directory there: only directories of this user, not links,
whose process is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import clean_env
from tests.security._store import (  # noqa: F401 - fixtures
    Hold,
    Worker,
    device_artifact,
    tiny_model,
)
from tests.weights.conftest import OPTS

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _left(where: Path, pattern: str) -> list[str]:
    return sorted(p.name for p in where.glob(pattern))


def test_a_worker_stopped_by_sigterm_leaves_no_restore_trace(tiny_model, device_artifact, tmp_path):
    w = Worker(tiny_model, device_artifact, tmp_path)
    w.ready()
    w.complete()
    assert _left(tmp_path, "medusa-restore-*") == []  # read by the start only: gone already
    w.stop(signal.SIGTERM)
    assert w.proc.returncode in (0, 128 + signal.SIGTERM)
    assert _left(tmp_path, "medusa-restore-*") == []


def test_a_killed_workers_restore_trace_is_swept_by_the_next_and_nothing_else(
    tiny_model, device_artifact, tmp_path
):
    hold = Hold(tmp_path / "hold", chunk=0)
    killed = Worker(tiny_model, device_artifact, tmp_path, env=hold.env())
    hold.held(killed.proc.pid)  # mid start-up: its trace directory is there
    mine = _left(tmp_path, f"medusa-restore-{killed.proc.pid}-*")
    assert len(mine) == 1
    killed.stop(signal.SIGKILL)
    dead = _dead_pid()
    planted = {
        "live": tmp_path / f"medusa-restore-{os.getpid()}-live0001",  # a process that runs
        "other user": tmp_path / f"medusa-restore-{dead}-other001",
        "link": tmp_path / f"medusa-restore-{dead}-link0001",
    }
    planted["live"].mkdir()
    planted["other user"].mkdir()
    if os.geteuid() == 0:
        os.chown(planted["other user"], 65534, 65534)
    else:  # (only root can plant a directory of another user's)
        planted["other user"].rmdir()
        del planted["other user"]
    target = tmp_path / "not-ours"
    target.mkdir()
    (target / "keep").touch()
    planted["link"].symlink_to(target)
    with Worker(tiny_model, device_artifact, tmp_path) as w:
        w.complete()
    left = _left(tmp_path, "medusa-restore-*")
    assert mine[0] not in left
    assert sorted(p.name for p in planted.values()) == left
    assert (target / "keep").exists()


def _materialize(model: Path, out: Path, tmpdir: Path, **kw) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    cmd = [sys.executable, "-m", "medusa.cli", "materialize", str(model), *OPTS, "--out", str(out)]
    env = {**clean_env(), "TMPDIR": str(tmpdir)}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)  # fmt: skip


def _wait_for_both(tmpdir: Path, out: Path, proc: subprocess.Popen[str]) -> None:
    """Until materialize is recording (its work directory) with its store written beside `out`."""
    deadline = time.monotonic() + 180
    while not (_left(tmpdir, "medusa-mat-*") and _left(out.parent, f".{out.name}.weights.*/*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)


def test_a_killed_materialize_is_cleaned_up_by_the_next_of_the_same_target(tiny_model, tmp_path):
    tmpdir, out = tmp_path / "tmp", tmp_path / "arts" / "tiny"
    tmpdir.mkdir()
    out.parent.mkdir()
    proc = _materialize(tiny_model, out, tmpdir, start_new_session=True)
    _wait_for_both(tmpdir, out, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert _left(tmpdir, "medusa-mat-*") and _left(out.parent, f".{out.name}.weights.*")
    again = _materialize(tiny_model, out, tmpdir)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert _left(tmpdir, "*") == []
    assert _left(out.parent, "*") == ["tiny"]


def test_a_materialize_stopped_by_sigterm_leaves_nothing(tiny_model, tmp_path):
    tmpdir, out = tmp_path / "tmp", tmp_path / "arts" / "tiny"
    tmpdir.mkdir()
    out.parent.mkdir()
    proc = _materialize(tiny_model, out, tmpdir)
    _wait_for_both(tmpdir, out, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert _left(tmpdir, "*") == []
    assert _left(out.parent, "*") == []
