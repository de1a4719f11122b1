"""Issue 30, finding 11: `medusa run --partition` with its follower (device 1) stopped by SIGSTOP
stalled every request for the link's 600 s while /health said ok. Now the link waits at most
--partition-timeout within a step: the request in flight gets a 503 naming the follower, /health
reports the broken link (so a gateway replaces the worker), and later requests are refused at
once rather than waiting."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from medusa.child import medusa_cli
from tests.processes import clean_env, medusa
from tests.security._shm import Worker, free_port, wait_healthy
from tests.tessera.conftest import CONFIG, tiny  # noqa: F401 - the session's artifact

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

OPTS = [f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]


def _follower(worker: int) -> int:
    """The follower process the worker started (its child running medusa.tessera.partition)."""
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == worker and b"medusa.tessera.partition" in cmd:
            return pid
    raise AssertionError("no follower process")


def test_a_stopped_follower_fails_the_request_and_health(tiny, tmp_path):  # noqa: F811
    art, _ = tiny
    plan = tmp_path / "plan.json"
    assert medusa("tessera", "place", str(art), "--out", str(plan)).returncode == 0
    port = free_port()
    cmd = medusa_cli("run", str(art.parent / "tiny.gguf"), *OPTS, "--artifact", str(art),
                     "--require-artifact", "--partition", str(plan), "--partition-timeout", "2",
                     "--served-model-name", "tiny", "--port", str(port))  # fmt: skip
    proc = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    w = Worker(proc, f"http://127.0.0.1:{port}")
    follower = 0
    try:
        wait_healthy(w)
        assert w.complete(max_tokens=4).status_code == 200  # split over both processes
        follower = _follower(proc.pid)
        os.kill(follower, signal.SIGSTOP)
        r = w.complete(max_tokens=4)  # NOTE: 60 s client timeout: the old wait was 600 s
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert f"follower (device 1, pid {follower}) did not answer in 2 s" in message
        health = w.get("/health")
        assert health.status_code == 500 and "did not answer" in health.json()["error"]
        assert w.complete(max_tokens=4).status_code == 503  # refused at once, no new wait
    finally:
        if follower:
            os.kill(follower, signal.SIGCONT)
        w.stop()
