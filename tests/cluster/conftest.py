"""A local Ray cluster (a head without slices; one CPU and a small object store per node), shared
by this directory's tests and stopped after them (idle, its processes still take about 3% of a
core from the rest of the suite), and gateways that place their workers on it. Each gateway
adds its own nodes (one simulated slice each) and removes those left when it stops, so the next
starts from the head."""

from __future__ import annotations

import contextlib
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
from tests.processes import ENGINE_OPTS, clean_env

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

SLICE = {"medusa_slice_8gb.132sm": 1}
NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}
ENGINE = (
    "{max_num_seqs: 4, max_model_len: 256, max_num_batched_tokens: 128, "
    "gpu_memory_utilization: 0.4}"
)


@dataclass
class RayCluster:
    cluster: Any
    tmp: Path
    cache: Path  # where the nodes' artifact caches go
    materializing: dict[Path, subprocess.Popen[str]]

    def start_artifact(self, name: str, *opts: str) -> Path:
        """Begins materializing a restore artifact (once per session); see `artifact`."""
        out = self.tmp / name
        if out not in self.materializing:
            self.materializing[out] = _materialize(out, *opts)
        return out

    def artifact(self, out: Path) -> Path:
        """The artifact `start_artifact` began, once it is there."""
        proc = self.materializing[out]
        if proc.returncode is None:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-4000:]
        return out


@dataclass
class RayGateway:
    cluster: Any
    nodes: list[Any]  # the nodes with slices, in the order they joined
    base: str
    artifact: Path
    cache: Path
    proc: subprocess.Popen[str]
    log: str = ""  # what it wrote, once stopped

    def add_node(self) -> Any:
        node = self.cluster.add_node(resources=SLICE, **NODE)
        self.nodes.append(node)
        return node

    def instances(self, model: str) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.base}/admin/instances").json()[model])


def _materialize(out: Path, *opts: str) -> subprocess.Popen[str]:
    """A restore artifact without a weight store (12 KiB: the worker loads the model file)."""
    argv = medusa_cli("materialize", "--no-weights", *ENGINE_OPTS, *opts, "--out", str(out))
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


@pytest.fixture(scope="package")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    tmp = tmp_path_factory.mktemp("ray")
    rc = RayCluster(None, tmp, tmp / "cache", {})
    rc.start_artifact("art")  # while the cluster starts
    # NOTE: the nodes' processes inherit this environment: it is where their caches go.
    saved = os.environ.get("MEDUSA_ARTIFACT_CACHE")
    os.environ["MEDUSA_ARTIFACT_CACHE"] = str(rc.cache)
    rc.cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        yield rc
    finally:
        rc.cluster.shutdown()
        for proc in rc.materializing.values():
            proc.kill()
            proc.communicate()
        if saved is None:
            os.environ.pop("MEDUSA_ARTIFACT_CACHE", None)
        else:
            os.environ["MEDUSA_ARTIFACT_CACHE"] = saved


@contextlib.contextmanager
def ray_gateway_on(rc: RayCluster, nodes: int, artifact: Path, models: str) -> Iterator[RayGateway]:
    """A gateway (models.yaml: `models`) on `rc` with `nodes` new slice nodes, once `artifact`
    (begun with `start_artifact`) is there; afterwards the nodes it left are removed."""
    cluster = rc.cluster
    added = [cluster.add_node(resources=SLICE, **NODE) for _ in range(nodes)]
    gw = None
    try:
        cluster.wait_for_nodes()
        rc.artifact(artifact)  # materialized meanwhile
        config = rc.tmp / f"models-{len(list(rc.tmp.glob('models-*')))}.yaml"
        config.write_text(models)
        port = _free_port()
        argv = medusa_cli(
            "gateway", "--config", str(config), "--port", str(port),
            "--cluster", f"ray://{cluster.address}",
        )  # fmt: skip
        proc = subprocess.Popen(
            argv,
            env={**clean_env(), "MEDUSA_ARTIFACT_CACHE": str(rc.cache)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        base = f"http://127.0.0.1:{port}"
        _wait_health(proc, base)
        gw = RayGateway(cluster, added, base, artifact, rc.cache, proc)
        yield gw
    finally:
        if gw is not None:
            gw.proc.send_signal(signal.SIGTERM)
            out, _ = gw.proc.communicate(timeout=60)
            sys.stderr.write(out[-3000:])
            gw.log = out
        for node in [n for n in added if n in cluster.worker_nodes]:
            cluster.remove_node(node)


@pytest.fixture(scope="module")
def ray_gateway(ray_cluster: RayCluster) -> Iterator[RayGateway]:
    """Two nodes with a slice each; models a, b, c on static slices."""
    artifact = ray_cluster.start_artifact("art")
    with ray_gateway_on(ray_cluster, 2, artifact, f"""
models:
  a: {{artifact: {artifact}, keep_alive: 600, target: 1, engine: {ENGINE}}}
  b: {{artifact: {artifact}, keep_alive: 600, engine: {ENGINE}}}
  c: {{artifact: {artifact}, keep_alive: 1, engine: {ENGINE}}}
""") as gw:  # fmt: skip
        yield gw


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
