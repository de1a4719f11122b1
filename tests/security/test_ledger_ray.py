"""Issue 30: the Ray back-end, tried as an attacker would. `medusa gateway --cluster ray` starts a
one-node Ray cluster that listens on every interface, and whoever joins it runs code as the
gateway's user (the slice actors hold the ledgers and start the workers). It now asks for a token
only this user can read (Ray's own default file is made mode 644), and refuses to start a
cluster without token authentication. The slice actor's ledger is private; a worker on the node
answers only its token, and has no weaving routes there (no directory is shared across nodes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from medusa.child import medusa_cli
from tests.processes import clean_env
from tests.security._shm import free_port, stop_gateway, tiny_model, wait_gateway

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

pytest.importorskip("ray")
SHM = Path("/dev/shm")
JOIN = """
import os, ray
try:
    ray.init(address={address!r}, logging_level="ERROR")
    print("RAN AS", ray.get(ray.remote(lambda: os.getuid()).remote(), timeout=60))
except Exception as e:
    print("REFUSED", type(e).__name__)
"""


def _descendants(root: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below `root`."""
    parent, cmd = {}, {}
    for p in (int(x) for x in os.listdir("/proc") if x.isdigit()):
        try:
            parent[p] = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
    found, todo = [], [root]
    while todo:
        here = todo.pop()
        kids = [p for p, pp in parent.items() if pp == here]
        found += [(k, cmd[k]) for k in kids]
        todo += kids
    return found


def _listening(pid: int) -> int:
    """The TCP port process `pid` listens on."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    [port] = {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines()
              if f"pid={pid}," in line}  # fmt: skip
    return port


def _join(address: str, **env: str) -> tuple[str, str]:
    """What a client gets that tries to join the cluster with `env` (and no ~/.ray token), and
    what Ray logged. A client the cluster turns away tries again each second, with the cluster's
    reason logged each time: 5 tries here, not Ray's 20 (RAY_gcs_server_port_wait_time_s)."""
    base = {k: v for k, v in clean_env().items() if not k.startswith("RAY_")}
    code = JOIN.format(address=address)
    env = {**base, "HOME": "/nonexistent", "RAY_gcs_server_port_wait_time_s": "5", **env}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    return (r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:]), r.stderr


@pytest.fixture
def a_cluster_already_here():
    """A Ray cluster running on this machine before the gateway starts (another user's, or a
    test's): Ray's own default joins the last one started instead of starting a new one."""
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 1, "include_dashboard": False, "object_store_memory": 80 << 20}
    other = Cluster(initialize_head=True, head_node_args=head)
    try:
        yield other
    finally:
        other.shutdown()


def test_the_ray_cluster_the_gateway_starts_lets_no_one_in_without_its_token(
    tmp_path, a_cluster_already_here
):
    model = tiny_model(tmp_path / "tiny.gguf")
    (tmp_path / "slices.yaml").write_text("slices:\n  - {name: s0, memory_gb: 1}\n")
    engine = "{max_model_len: 128, max_num_seqs: 4, max_num_batched_tokens: 128}"
    config = tmp_path / "models.yaml"
    config.write_text(f"models:\n  tiny: {{model: {model}, slo_ttft: 2, engine: {engine}}}\n"
                      "slices: slices.yaml\nsharing: elastic\n")  # fmt: skip
    argv = medusa_cli("gateway", "--config", str(config), "--cluster", "ray")
    no_auth = {**clean_env(), "RAY_AUTH_MODE": "disabled"}
    refused = subprocess.run([*argv, "--port", str(free_port())], capture_output=True, text=True,
                             env=no_auth, timeout=120)  # fmt: skip
    assert refused.returncode != 0 and "without token authentication" in refused.stderr
    port = free_port()
    proc = subprocess.Popen([*argv, "--port", str(port)], env=clean_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_gateway(proc, base, timeout=240)
        [token] = SHM.glob(f"medusa-shm-{proc.pid}-*/ray-auth-token")
        assert (token.stat().st_mode & 0o777, token.parent.stat().st_mode & 0o777) == (0o600, 0o700)
        body = {"model": "tiny", "prompt": "once upon a time", "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=240)
        assert r.status_code == 200, r.text
        [inst] = httpx.get(f"{base}/admin/instances").json()["tiny"]
        node = inst["address"].rsplit(":", 1)[0]  # the node's address: where Ray listens too
        [gcs] = [pid for pid, c in _descendants(proc.pid) if "gcs_server" in c.split()[0]]
        address = f"{node}:{_listening(gcs)}"
        refused, log = _join(address)
        assert refused.startswith("REFUSED")
        assert "Authentication token is missing or incorrect" in log, log[-2000:]  # the reason
        assert _join(address, RAY_AUTH_MODE="token")[0].startswith("REFUSED")  # no token to give
        with_token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        assert _join(address, **with_token)[0] == f"RAN AS {os.getuid()}"  # what the token opens
        ledgers = [p for pid, _ in _descendants(proc.pid)
                   for p in SHM.glob(f"medusa-shm-{pid}-*/ledger-*")]  # fmt: skip
        assert ledgers and all(
            (p.stat().st_mode & 0o777, p.parent.stat().st_mode & 0o777) == (0o600, 0o700)
            for p in ledgers
        )
        environ = Path(f"/proc/{inst['pid']}/environ").read_bytes().split(b"\0")
        [secret] = [e[20:].decode() for e in environ if e.startswith(b"MEDUSA_WORKER_TOKEN=")]
        worker = f"http://{inst['address']}"
        assert httpx.get(f"{worker}/v1/models", timeout=30).status_code == 401
        r = httpx.get(f"{worker}/weaving", headers={"x-medusa-worker-token": secret}, timeout=30)
        assert r.status_code == 404 and "weaving is off" in r.json()["error"]["message"]
    finally:
        out = stop_gateway(proc)
    assert not list(SHM.glob(f"medusa-shm-{proc.pid}-*")), out[-3000:]
