"""`medusa run --tensor-parallel-size N`: this process serves HTTP as rank 0 and the other ranks
follow its steps; the answers are one device's, and a rank that dies or is stopped fails the
requests and /health within the collectives' timeout instead of hanging them with /health ok."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from medusa.child import medusa_cli
from tests.processes import child_running, clean_env, medusa
from tests.security._shm import Worker, free_port, tiny_model, wait_healthy

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

OPTS = ["--max-num-seqs", "2", "--max-model-len", "128", "--max-num-batched-tokens", "64"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tp-serve") / "tiny.gguf")


def _answer(model: Path, *args: str) -> str:
    res = medusa("run", str(model), *OPTS, "--demo", "hello there", "--port", str(free_port()),
                 *args)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    answer = res.stdout[res.stdout.find("assistant: ") :]
    return re.sub(r"\(\d+ tokens in [0-9.]+ s\)", "", answer)  # the timing aside


@pytest.mark.parametrize("n", [2, 4])
def test_a_tensor_parallel_server_answers_as_one_device(model, n):
    assert _answer(model, "--tensor-parallel-size", str(n)) == _answer(model)


def _serve_two_ranks(model: Path) -> Worker:
    """`medusa run MODEL --tensor-parallel-size 2` on a free port, collectives' timeout 2 s."""
    port = free_port()
    cmd = medusa_cli("run", str(model), *OPTS, "--tensor-parallel-size", "2",
                     "--served-model-name", "tiny", "--port", str(port))  # fmt: skip
    env = {**clean_env(), "MEDUSA_NCCL_TIMEOUT": "2"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    return Worker(proc, f"http://127.0.0.1:{port}")


def _health_fails_within(w: Worker, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r = w.get("/health")
        if r.status_code != 200:
            return r.json()  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"/health still ok after {seconds} s")


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_rank_that_stops_or_dies_fails_requests_and_health(model, how):
    w = _serve_two_ranks(model)
    proc = w.proc
    follower = 0
    try:
        wait_healthy(w)
        assert w.complete(max_tokens=4).status_code == 200
        follower = child_running(proc.pid, b"tensor_parallel")
        os.kill(follower, signal.SIGSTOP if how == "stopped" else signal.SIGKILL)
        # idle: the heartbeat finds it (a stopped rank within the 2 s timeout, a dead one at
        # the next beat)
        health = _health_fails_within(w, 10)
        assert f"tensor-parallel rank 1 (pid {follower})" in health["error"]
        r = w.complete(max_tokens=4)  # refused at once with the reason
        assert r.status_code == 503 and "tensor-parallel rank 1" in r.json()["error"]["message"]
    finally:
        if follower and how == "stopped":
            os.kill(follower, signal.SIGCONT)
        w.stop()


def test_a_rank_stopped_mid_request_fails_it_within_the_timeout(model):
    w = _serve_two_ranks(model)
    proc = w.proc
    follower = 0
    try:
        wait_healthy(w)
        follower = child_running(proc.pid, b"tensor_parallel")
        os.kill(follower, signal.SIGSTOP)
        t0 = time.monotonic()
        r = w.complete(max_tokens=64)  # its first step's collectives wait for rank 1
        assert r.status_code == 503 and time.monotonic() - t0 < 15, r.text
        assert w.get("/health").status_code != 200
    finally:
        if follower:
            os.kill(follower, signal.SIGCONT)
        w.stop()


def test_tensor_parallelism_refuses_what_it_cannot_combine_with(model, tmp_path):
    res = medusa("run", "--tensor-parallel-size", "2", "--pool")
    assert res.returncode == 2 and "does not combine with --pool or --partition" in res.stderr
