"""What the security tests share: workers and gateways as real processes on real HTTP, a tiny
model, the Weaver task an attacker posts, and another user to attack from."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType as T

from medusa.child import medusa_cli
from medusa.weaver.region import DONE, STATUS, TASK, ExchangeRegion
from tests.engine.tiny_models import write_gguf
from tests.processes import clean_env

ENGINE = ["--max-num-seqs", "4", "--max-model-len", "128", "--max-num-batched-tokens", "128",
          "--kv-cache-memory", str(4 << 20)]  # fmt: skip
NOBODY = 65534


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_model(path: Path, seed: int = 0) -> Path:
    if not path.exists():
        write_gguf(path, [T.F32], seed=seed)
    return path


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    base: str
    headers: dict[str, str] = field(default_factory=dict)
    name: str = "tiny"

    def get(self, path: str, **kw: object) -> httpx.Response:
        return httpx.get(self.base + path, headers=self.headers, timeout=60, **kw)  # type: ignore[arg-type]

    def post(self, path: str, body: dict[str, object], timeout: float = 60) -> httpx.Response:
        return httpx.post(self.base + path, json=body, headers=self.headers, timeout=timeout)

    def complete(self, prompt: str = "once upon a time", max_tokens: int = 8) -> httpx.Response:
        body = {"model": self.name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        return self.post("/v1/completions", body)

    def answer(self, prompt: str = "once upon a time") -> str:
        r = self.complete(prompt)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["text"])

    def stop(self) -> str:
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err or ""


def start_worker(
    model: Path, *flags: str, token: str = "", weaving_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> Worker:  # fmt: skip
    """`medusa run MODEL` on a free port; as the gateway starts one with a token (and its
    directory of exchange regions), or standalone without."""
    port = free_port()
    full = clean_env() | (env or {})
    if token:
        full["MEDUSA_WORKER_TOKEN"] = token
    if weaving_dir is not None:
        full["MEDUSA_WEAVING_DIR"] = str(weaving_dir)
    cmd = medusa_cli("run", str(model), *ENGINE, *flags, "--served-model-name", "tiny",
                     "--port", str(port))  # fmt: skip
    proc = subprocess.Popen(cmd, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    w = Worker(proc, f"http://127.0.0.1:{port}", {"x-medusa-worker-token": token} if token else {})
    wait_healthy(w)
    return w


def wait_healthy(w: Worker, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if w.proc.poll() is not None:
            raise AssertionError(f"the worker exited: {w.stop()[-3000:]}")
        try:
            if w.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the worker did not become healthy: {w.stop()[-3000:]}")


def private_dir(tmp_path: Path, name: str = "regions") -> Path:
    d = tmp_path / name
    d.mkdir(mode=0o700)
    return d


def post_task(region: ExchangeRegion, head: tuple[int, int, int, int], timeout: float = 30) -> str:
    """Posts one task as a sender would (a hostile one here) and waits for the receiver: the
    refusal it wrote, or "" if it ran the task."""
    region.set_task_head(*head)
    task = region.counter(TASK) + 1
    region.set_counter(TASK, task)
    deadline = time.monotonic() + timeout
    while region.counter(DONE) < task:
        assert time.monotonic() < deadline, "the receiver did not take the task"
        time.sleep(0.001)
    if region.counter(STATUS):
        region.set_counter(STATUS, 0)
        return region.error()
    return ""


def start_gateway(
    config: Path, *, pid_file: Path | None = None
) -> tuple[subprocess.Popen[str], str]:
    """`medusa gateway` on a free port. Its pid is known before it runs any of its code (`sh`
    execs it after a line on stdin), so a test can plant files for that pid first: with
    `pid_file`, the pid is written there and the gateway waits for `release(proc)`."""
    port = free_port()
    argv = medusa_cli("gateway", "--config", str(config), "--port", str(port))
    if pid_file is not None:
        argv = ["sh", "-c", 'read _ && exec "$@"', "sh", *argv]
    proc = subprocess.Popen(argv, env=clean_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    if pid_file is not None:
        pid_file.write_text(str(proc.pid))
    return proc, base


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def wait_gateway(proc: subprocess.Popen[str], base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the gateway did not start:\n{proc.communicate()[0][-3000:]}")


def stop_gateway(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def as_another_user(code: str) -> subprocess.CompletedProcess[str]:
    """Python `code` (the standard library only) run as user nobody, the attacker: skipped where
    this process cannot switch users (not root) or nobody can run no Python."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("switching to another user needs root and setpriv")
    switch = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run([*switch, python, "-c", "pass"], capture_output=True, cwd="/")
        if probe.returncode == 0:
            return subprocess.run([*switch, python, "-c", code], capture_output=True, text=True,
                                  timeout=60, cwd="/")  # fmt: skip
    pytest.skip("user nobody can run no Python here")
