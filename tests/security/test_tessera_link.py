"""Issue 30, finding 11: `medusa run --partition` with its follower (device 1) stopped by SIGSTOP
stalled every request for the link's 600 s while /health said ok. Now the link waits at most
--partition-timeout within a step: the request in flight gets a 503 naming the follower, /health
reports the broken link (so a gateway replaces the worker), and later requests are refused at
once rather than waiting."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from medusa.child import medusa_cli
from tests.processes import child_running, clean_env, medusa
from tests.security._shm import Worker, free_port, wait_healthy
from tests.tessera.conftest import CONFIG, tiny  # noqa: F401 - the session's artifact

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

OPTS = [f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]


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
        follower = child_running(proc.pid, b"medusa.tessera.partition")
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
