"""Finding 1 (worker port squatting): the gateway's workers listen where no other local user can
get there first, and the gateway checks that it speaks to its own worker.

Locally, a worker serves on a Unix socket the gateway binds in a directory only its user can
enter, and is handed it: another user who watches /proc (as the attack did, to bind the port a
worker was told before the worker could) finds no port to take and cannot reach the socket. Over
TCP (a Ray node's workers), whatever answers in a worker's place never sees the worker's token,
and the gateway drops its answers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from medusa.child import medusa_cli
from medusa.serve.gateway.backends.child_process import ChildProcess, launch
from medusa.serve.gateway.hop import Hop
from medusa.serve.gateway.worker_link import NotOurWorker, connect
from medusa.serve.listeners import bind_tcp
from tests.processes import SUITE_SIM, clean_env
from tests.security._net import (
    ATTACKER_PYTHON,
    KEY,
    SMOLLM2_ENGINE,
    TINY_ARGS,
    as_nobody,
    gateway_config,
    instances,
    listening_tcp_ports,
    start_gateway,
    start_worker,
    stop,
    tiny_model,
    wait_health,
)

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

KEEP = ("MEDUSA_LIB_DIR", *SUITE_SIM)  # where the libraries are, and the suite's race checking

# Another local user: binds every port a worker of the gateway (argv[1], the gateway's pid) is
# told on its command line, as soon as it shows in /proc, and answers on it (what took every
# request on main); says what it bound.
SQUATTER = r"""
import json, os, signal, socket, sys
gateway, bound, stop = sys.argv[1], {}, []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))

def parent(pid):
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]

while not stop:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            mine = parent(pid) == gateway
        except OSError:
            continue
        if mine and b"--port" in argv:
            port = int(argv[argv.index(b"--port") + 1])
            if port not in bound:
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", port)); s.listen(); bound[port] = s
                except OSError:
                    bound[port] = None
print(json.dumps(sorted(p for p, s in bound.items() if s is not None)))
"""

CONNECT = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(ATTACKER_PYTHON, os.X_OK),
    reason="plays another local user: needs root and a system python3",
)
def test_another_user_finds_no_worker_port_and_cannot_reach_the_workers_sockets(tmp_path):
    config = gateway_config(
        tmp_path, f"  a: {{engine: {SMOLLM2_ENGINE}}}\n", "warm_pool: 1\napi_keys: [k]\n"
    )
    proc, base = start_gateway(config)
    squatter = subprocess.Popen(
        [ATTACKER_PYTHON, "-c", SQUATTER, str(proc.pid)], stdout=subprocess.PIPE, text=True,
        preexec_fn=as_nobody(),
    )  # fmt: skip
    try:
        body = {"model": "a", "prompt": "The capital of France is", "max_tokens": 4,
                "temperature": 0}  # fmt: skip
        r = httpx.post(f"{base}/v1/completions", json=body, headers=KEY, timeout=300)
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"]
        (inst,) = instances(base, "a")
        pooled = httpx.get(f"{base}/admin/pool", headers=KEY).json()
        for pid in [inst["pid"], *(w["pid"] for w in pooled)]:
            assert listening_tcp_ports(pid) == set(), f"worker {pid} listens on TCP"
        path = Path(inst["address"].removeprefix("unix:"))
        home = path.parent.stat()
        assert stat.S_IMODE(home.st_mode) == 0o700 and home.st_uid == os.getuid()
        reach = subprocess.run(
            [ATTACKER_PYTHON, "-c", CONNECT, str(path)], capture_output=True, text=True,
            preexec_fn=as_nobody(),
        )  # fmt: skip
        assert reach.returncode != 0 and "PermissionError" in reach.stderr
    finally:
        squatter.send_signal(signal.SIGTERM)
        taken = json.loads(squatter.communicate(timeout=30)[0])
        stop(proc)
    assert taken == []  # no worker was told a port to take
    assert not path.parent.exists()  # the gateway removed its sockets when it stopped


class _Impostor(BaseHTTPRequestHandler):
    """Answers 200 to everything, as a worker would, and keeps the headers it was sent."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(dict(self.headers))
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("x-medusa-worker-proof", "0" * 64)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_an_impostor_on_a_tcp_worker_address_gets_no_token_and_is_refused(tmp_path, monkeypatch):
    """A Ray node's worker, started as its slice actor starts it (the actor binds a port the
    kernel picks and hands the socket down), and an impostor on another port: the gateway's
    client proves itself to both without sending the token, accepts the worker's answers and
    refuses the impostor's."""
    for k in [k for k in os.environ if k.startswith("MEDUSA_") and k not in KEEP]:
        monkeypatch.delenv(k)
    args = [str(tiny_model(tmp_path)), *TINY_ARGS, "--served-model-name", "tiny"]
    worker = launch({}, args, bind_tcp("127.0.0.1"))
    assert "--fd" in worker.popen.args and "--port" not in worker.popen.args
    impostor = ThreadingHTTPServer(("127.0.0.1", 0), _Impostor)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    try:
        health, proof, forged = asyncio.run(_ask_both(worker, impostor.server_port))
    finally:
        impostor.shutdown()
    assert health == 200 and len(proof) == 64
    assert forged == 401  # a request that does not prove it holds the token
    assert _Impostor.seen and all(worker.token not in json.dumps(h) for h in _Impostor.seen)


async def _ask_both(worker: ChildProcess, impostor_port: int) -> tuple[int, str, int]:
    """The worker's /health through the gateway's client (once it serves), the impostor's (it
    must raise), and the worker's answer to a forged proof; then the worker is stopped."""
    try:
        return await _ask(worker, impostor_port)
    finally:
        await worker.reap()


async def _ask(worker: ChildProcess, impostor_port: int) -> tuple[int, str, int]:
    for _ in range(900):
        try:
            r = await worker.client.get("/health", timeout=2)
            if r.status_code == 200:
                break
        except NotOurWorker:
            raise
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    async with connect("", "127.0.0.1", impostor_port, worker.token) as client:
        with pytest.raises(NotOurWorker, match="without proving it is the gateway's worker"):
            await client.get("/health")
    # the forwarded requests' path (hop): the worker's answer is relayed, the impostor's is not
    body = json.dumps({"model": "tiny", "prompt": [5, 6], "max_tokens": 2}).encode()
    answer = await worker.hop.post("/v1/completions", body)
    assert answer.status_code == 200 and b'"text_completion"' in await answer.read()
    with pytest.raises(NotOurWorker):
        await Hop("", "127.0.0.1", impostor_port, worker.token).post("/v1/completions", body)
    forged = {"x-medusa-worker-auth": "00" * 16 + "." + "0" * 64}
    async with httpx.AsyncClient(base_url=f"http://{worker.host}:{worker.port}") as plain:
        refused = (await plain.get("/health", headers=forged)).status_code
    return r.status_code, r.headers.get("x-medusa-worker-proof", ""), refused


def test_medusa_run_uds_makes_its_own_socket_and_refuses_a_planted_one(tmp_path):
    """`medusa run --uds PATH`, the standalone worker's way off TCP: the socket is made by the
    command, mode 0600; a file or link planted at PATH first is refused, never replaced."""
    model = str(tiny_model(tmp_path))
    planted = tmp_path / "planted.sock"
    planted.symlink_to(tmp_path / "elsewhere")
    refused = subprocess.run(
        medusa_cli("run", model, "--uds", str(planted)), env=clean_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0 and "something exists there" in refused.stderr
    assert planted.is_symlink() and not (tmp_path / "elsewhere").exists()

    path = tmp_path / "w.sock"
    worker = start_worker(model, "--uds", str(path), *TINY_ARGS, "--served-model-name", "tiny")
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path))) as c:
            wait_health(worker, "http://worker", c)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}
            r = c.post("http://worker/v1/completions", json=body)
            assert r.status_code == 200, r.text
        assert listening_tcp_ports(worker.pid) == set()
    finally:
        stop(worker)
    assert not path.exists()  # removed when it stopped
