"""A local Ray cluster (head without slices, two nodes with one simulated slice each; one CPU and
a small object store per node) and a gateway that places its workers on it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from medusa.child import medusa_cli
from tests.materialize.conftest import ENGINE_OPTS, clean_env

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

SLICE = {"medusa_slice_8gb.132sm": 1}
NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}
ENGINE = (
    "{max_num_seqs: 4, max_model_len: 256, max_num_batched_tokens: 128, "
    "gpu_memory_utilization: 0.4}"
)


@dataclass
class RayGateway:
    cluster: Any
    nodes: list[Any]  # the nodes with slices, in the order they joined
    base: str
    artifact: Path
    cache: Path
    proc: subprocess.Popen[str]

    def add_node(self) -> Any:
        node = self.cluster.add_node(resources=SLICE, **NODE)
        self.nodes.append(node)
        return node

    def instances(self, model: str) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.base}/admin/instances").json()[model])


def _materialize(out: Path) -> subprocess.Popen[str]:
    """A restore artifact without a weight store (12 KiB: the worker loads the model file)."""
    argv = medusa_cli("materialize", "--no-weights", *ENGINE_OPTS, "--out", str(out))
    return subprocess.Popen(
        argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_health(proc: subprocess.Popen[str], base: str) -> None:
    for _ in range(600):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the gateway did not start:\n{proc.communicate()[0][-4000:]}")


@pytest.fixture(scope="module")
def ray_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayGateway]:
    tmp = tmp_path_factory.mktemp("ray")
    artifact, cache = tmp / "art", tmp / "cache"
    materialize = _materialize(artifact)  # while the cluster starts
    # NOTE: the nodes' processes inherit this environment: it is where their caches go.
    saved = os.environ.get("MEDUSA_ARTIFACT_CACHE")
    os.environ["MEDUSA_ARTIFACT_CACHE"] = str(cache)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**NODE, "include_dashboard": False},
    )
    try:
        nodes = [cluster.add_node(resources=SLICE, **NODE) for _ in range(2)]
        cluster.wait_for_nodes()
        _, err = materialize.communicate(timeout=300)
        assert materialize.returncode == 0, err[-4000:]
        (tmp / "models.yaml").write_text(f"""
models:
  a: {{artifact: {artifact}, keep_alive: 600, target: 1, engine: {ENGINE}}}
  b: {{artifact: {artifact}, keep_alive: 600, engine: {ENGINE}}}
  c: {{artifact: {artifact}, keep_alive: 1, engine: {ENGINE}}}
""")
        port = _free_port()
        argv = medusa_cli(
            "gateway",
            "--config",
            str(tmp / "models.yaml"),
            "--port",
            str(port),
            "--cluster",
            f"ray://{cluster.address}",
        )
        proc = subprocess.Popen(
            argv,
            env={**clean_env(), "MEDUSA_ARTIFACT_CACHE": str(cache)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        base = f"http://127.0.0.1:{port}"
        _wait_health(proc, base)
        yield RayGateway(cluster, nodes, base, artifact, cache, proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        sys.stderr.write(out[-3000:])
    finally:
        cluster.shutdown()
        if saved is None:
            os.environ.pop("MEDUSA_ARTIFACT_CACHE", None)
        else:
            os.environ["MEDUSA_ARTIFACT_CACHE"] = saved


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
