"""Prism and the warm pool under `medusa gateway --cluster ray`: two models share one elastic
slice on a Ray node, one from the warm pool, one started. The slice's page ledger is made on that
node by the slice's actor (which starts the workers, pooled too, and names the ledger to them);
the gateway holds the models' weight rows and reads free pages through it."""

from __future__ import annotations

import concurrent.futures
import os
import re
import time
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType as T

from tests.cluster.conftest import ENGINE, RayCluster, RayGateway, ray_gateway_on
from tests.engine.tiny_models import write_gguf
from tests.serve.test_pool import _pool

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

ray = pytest.importorskip("ray")

PAGE = 2 << 20


def _metrics(gw: RayGateway, name: str, label: str) -> dict[str, float]:
    """`name`'s samples by the value of their `label`."""
    out = {}
    for line in httpx.get(f"{gw.base}/metrics").text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            out[labels[label]] = float(line.split()[-1])
    return out


def _ledger_of(pid: int) -> Path:
    """The ledger a worker (on this machine's local cluster) was given, and who started it."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    [path] = [e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"MEDUSA_KV_LEDGER=")]
    return Path(path)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _ask(gw: RayGateway, model: str, max_tokens: int) -> int:
    body = {"model": model, "prompt": "once upon a time", "max_tokens": max_tokens}
    r = httpx.post(f"{gw.base}/v1/completions", json={**body, "temperature": 0}, timeout=300)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["completion_tokens"])


def test_two_models_share_a_nodes_elastic_slice_one_from_the_pool(ray_cluster: RayCluster) -> None:
    # a tiny model: 8 layers, 4 KV heads: 256 KiB blocks, 8 a page
    gguf = ray_cluster.tmp / "tiny.gguf"
    write_gguf(gguf, [T.F32], seed=1, dims={"layers": 8, "kv_heads": 4})
    artifact = ray_cluster.start_artifact("art-elastic", str(gguf), "--kv-memory", "elastic")
    models = f"""
models:
  a: {{model: {gguf}, artifact: {artifact}, slo_ttft: 0.5, engine: {ENGINE}}}
  b: {{model: {gguf}, artifact: {artifact}, slo_ttft: 2, engine: {ENGINE}}}
sharing: elastic
prism: {{concurrency: 4}}
warm_pool: 1
"""
    with ray_gateway_on(ray_cluster, 1, artifact, models) as gw:
        (pooled,) = _pool(gw.base, 1)  # a pooled worker waits on the node's elastic slice
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            assert list(pool.map(_ask, [gw] * 2, "ab", [4, 4])) == [4, 4]  # both start there
            insts = {m: gw.instances(m) for m in "ab"}
            assert [len(i) for i in insts.values()] == [1, 1], insts
            [a], [b] = insts.values()
            assert a["slice"] == b["slice"] and a["node"] == b["node"] == gw.nodes[0].node_id
            # The ledger is on the node, made by the slice's actor: the workers' parent there.
            ledger = _ledger_of(a["pid"])
            assert _ledger_of(b["pid"]) == ledger and ledger.exists()
            # in the actor's private directory (mode 700), itself private (600)
            assert ledger.parent.name.startswith(f"medusa-shm-{_parent(a['pid'])}-")
            assert (ledger.stat().st_mode & 0o777, ledger.parent.stat().st_mode & 0o777) == (
                0o600, 0o700)  # fmt: skip
            assert _parent(b["pid"]) == _parent(a["pid"]) != gw.proc.pid
            assert pooled["pid"] in (a["pid"], b["pid"])  # one came from the pool
            # The gateway reads it through the actor: the models' weights are held there.
            free = _metrics(gw, "medusa_prism_ledger_pages", "state")
            assert free["capacity"] == 8 * 2**30 // PAGE
            assert free["free"] < free["capacity"]
            seen: dict[str, float] = {}
            done = [pool.submit(_ask, gw, m, 200) for m in "ab"]
            while not all(f.done() for f in done):
                pages = _metrics(gw, "medusa_prism_pages_held", "model")
                if pages.get("a", 0) > 0 and pages.get("b", 0) > 0:
                    seen = pages  # both workers hold KV pages of the node's one ledger at once
                time.sleep(0.05)
            assert [f.result() for f in done] == [200, 200]
            assert seen, f"never saw both models' KV pages at once: {pages}"
        assert os.path.exists(ledger)
    assert not ledger.exists(), gw.log[-2000:]  # the gateway removed it through the actor
