"""What the security tests share: real gateways and workers started as subprocesses on tiny models
(or SmolLM2 where the answer must be right), and the attacker's tools: half-sent requests, the
listening TCP ports of a process, another local user."""

from __future__ import annotations

import os
import pwd
import resource
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from gguf import GGMLQuantizationType as T

from medusa.child import medusa_cli
from tests.engine.tiny_models import write_gguf
from tests.processes import clean_env

TINY_ENGINE = "{max_num_seqs: 4, max_model_len: 128, max_num_batched_tokens: 128}"
TINY_ARGS = ["--max-num-seqs", "4", "--max-model-len", "128", "--max-num-batched-tokens", "128"]
SMOLLM2_ENGINE = (
    "{max_num_seqs: 4, max_model_len: 256, max_num_batched_tokens: 128, "
    "gpu_memory_utilization: 0.4}"
)
KEY = {"Authorization": "Bearer k"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_model(tmp: Path, name: str = "tiny") -> Path:
    path = tmp / f"{name}.gguf"
    if not path.exists():
        write_gguf(path, [T.F32], seed=0)
    return path


def gateway_config(tmp: Path, models: str, extra: str = "", slices: int = 2) -> Path:
    """models.yaml with `models` (its lines under `models:`) on `slices` simulated slices."""
    (tmp / "slices.yaml").write_text(
        "slices:\n" + "".join(f"  - {{name: s{i}, memory_gb: 8}}\n" for i in range(slices))
    )
    path = tmp / "models.yaml"
    path.write_text(f"models:\n{models}slices: slices.yaml\n{extra}")
    return path


def nofile(limit: int) -> Callable[[], None]:
    """A preexec_fn that gives the child `limit` descriptors, soft and hard."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def start_gateway(
    config: Path, *args: str, preexec: Callable[[], None] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """`medusa gateway --config CONFIG ARGS` once it answers /health: (process, base URL)."""
    port = free_port()
    proc = subprocess.Popen(
        medusa_cli("gateway", "--config", str(config), "--port", str(port), *args),
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=preexec,
    )
    base = f"http://127.0.0.1:{port}"
    wait_health(proc, base)
    return proc, base


def start_worker(
    *args: str, env: dict[str, str] | None = None, **popen: object
) -> subprocess.Popen[str]:
    """`medusa run ARGS` (output kept); the caller waits for it to serve."""
    return subprocess.Popen(
        medusa_cli("run", *args),
        env={**clean_env(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,  # type: ignore[call-overload]
    )


def wait_health(
    proc: subprocess.Popen[str], base: str, client: httpx.Client | None = None, timeout: float = 180
) -> None:
    """Until `base`/health answers 200 (through `client`, e.g. over a Unix socket)."""
    client = client or httpx.Client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"{base} did not become healthy:\n{proc.communicate()[0][-4000:]}")


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then its output (SIGKILL if it does not end in 60 s)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[0]


def instances(base: str, model: str) -> list[dict]:
    return list(httpx.get(f"{base}/admin/instances", headers=KEY).json()[model])


def listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its socket descriptors in LISTEN state)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for row in (line.split() for line in lines):
            if row[3] == "0A" and row[9] in inodes:  # 0A: LISTEN
                ports.add(int(row[1].rsplit(":", 1)[1], 16))
    return ports


def half_sent(
    port: int, count: int, head: bytes = b"POST /v1/completions HTTP/1.1\r\nHo"
) -> list[socket.socket]:
    """`count` connections that each send the start of a request's head, and no more: the slow
    client of a descriptor-exhaustion attack."""
    conns = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(head)
        conns.append(s)
    return conns


def answer_of(conn: socket.socket, timeout: float) -> bytes:
    """What the server sent on `conn` before closing it (b"" if nothing within `timeout`)."""
    conn.settimeout(timeout)
    try:
        return conn.recv(4096)
    except (TimeoutError, ConnectionError):
        return b""


def raise_nofile(want: int) -> None:
    """This process may hold `want` descriptors (the attacker's sockets), within its hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


# The interpreter another user runs (stdlib only): this one may live where `nobody` cannot enter.
ATTACKER_PYTHON = "/usr/bin/python3"


def as_nobody() -> Callable[[], None]:
    """A preexec_fn that makes the child another local user (needs root)."""
    user = pwd.getpwnam("nobody")
    return lambda: (os.setgid(user.pw_gid), os.setuid(user.pw_uid))  # type: ignore[func-returns-value]
