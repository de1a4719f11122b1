"""`medusa gateway --cluster ray`: workers placed on the nodes of a local Ray cluster. In order
(one module-scoped cluster): scale from zero onto a node's slice, a second model on the other
node, a node added later takes the next model, a node lost mid-request, an artifact damaged on
its way is refused by the node."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from medusa.child import ROOT
from tests.cluster.conftest import RayGateway

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

ray = pytest.importorskip("ray")

CHAT = {
    "messages": [{"role": "user", "content": "Tell me a long story."}],
    "temperature": 0,
    "max_tokens": 32,
}
ANSWERS: dict[str, str] = {}


def _chat(gw: RayGateway, model: str) -> httpx.Response:
    return httpx.post(f"{gw.base}/v1/chat/completions", json={**CHAT, "model": model}, timeout=300)


def _stream(gw: RayGateway, model: str) -> str:
    body = {**CHAT, "model": model, "max_tokens": 200, "stream": True}
    url = f"{gw.base}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=300) as r:
        return "".join(r.iter_text())


def _text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def _node_of(gw: RayGateway, model: str) -> str:
    [inst] = gw.instances(model)
    return str(inst["node"])


def test_scales_from_zero_onto_a_nodes_slice(ray_gateway: RayGateway) -> None:
    gw = ray_gateway
    ANSWERS["a"] = _text(_chat(gw, "a"))
    node = _node_of(gw, "a")
    assert node in {n.node_id for n in gw.nodes}  # not the head: it has no slice
    # the artifact was shipped to that node and verified there, under its digest
    cached = list((gw.cache / f"node-{node[:16]}").iterdir())
    assert [p.name for p in cached if len(p.name) == 64], cached


def test_two_models_land_on_different_nodes(ray_gateway: RayGateway) -> None:
    gw = ray_gateway
    assert _text(_chat(gw, "b")) == ANSWERS["a"]  # the same artifact, the same greedy answer
    assert _node_of(gw, "b") != _node_of(gw, "a")  # a's node has no free slice left


def test_a_node_added_later_receives_work(ray_gateway: RayGateway) -> None:
    gw = ray_gateway
    new = gw.add_node()
    deadline = time.monotonic() + 30
    r = _chat(gw, "c")
    while r.status_code == 503 and time.monotonic() < deadline:  # until the gateway sees it
        time.sleep(0.5)
        r = _chat(gw, "c")
    assert _text(r) == ANSWERS["a"]
    assert _node_of(gw, "c") == new.node_id


def test_nodes_lost_mid_request(ray_gateway: RayGateway) -> None:
    """a's request is answered on another node; b's stream ends with an error event."""
    gw = ray_gateway
    deadline = time.monotonic() + 30
    while gw.instances("c") and time.monotonic() < deadline:  # keep_alive 1 s: its slice frees
        time.sleep(0.2)
    assert not gw.instances("c")
    insts = {m: gw.instances(m) for m in "ab"}
    assert [len(i) for i in insts.values()] == [1, 1], insts  # both warm (keep_alive 600 s)
    [a], [b] = insts.values()
    lost = [n for n in gw.nodes if n.node_id in (a["node"], b["node"])]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        stream = pool.submit(_stream, gw, "b")
        answer = pool.submit(_chat, gw, "a")
        while not (gw.instances("a")[0]["inflight"] and gw.instances("b")[0]["inflight"]):
            time.sleep(0.02)
        time.sleep(0.1)
        # The nodes lose power: their workers die at once, then their raylets.
        for inst in (a, b):
            os.kill(inst["pid"], signal.SIGKILL)
        for node in lost:
            gw.cluster.remove_node(node)
        assert _text(answer.result(timeout=120)) == ANSWERS["a"]
        events = stream.result(timeout=60)
    assert "the worker stopped in the middle of the answer" in events
    assert "[DONE]" not in events
    assert _node_of(gw, "a") == gw.nodes[-1].node_id  # the one node left with a slice


def test_a_node_refuses_an_artifact_damaged_on_its_way(
    ray_gateway: RayGateway, tmp_path: Path
) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from medusa.serve.gateway.artifact_cache import ArtifactSource, ship

    gw = ray_gateway
    damaged = tmp_path / "damaged"
    shutil.copytree(gw.artifact, damaged)
    image = next((damaged / "images").iterdir())
    image.write_bytes(bytes(b ^ 1 for b in image.read_bytes()))
    ray.init(address=gw.cluster.address, runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    try:
        source = ArtifactSource.remote()
        # on the head, which has never cached this artifact (the damaged copy has its digest)
        head = NodeAffinitySchedulingStrategy(gw.cluster.head_node.node_id, soft=False)
        fetch = _fetch.options(scheduling_strategy=head)
        with pytest.raises(ray.exceptions.RayTaskError, match="checksum mismatch"):
            ray.get(fetch.remote(ship(damaged, source, small=1024, chunk=4096)))
        # the intact artifact, its plan in 4 KiB chunks, arrives and is verified
        path = Path(ray.get(fetch.remote(ship(gw.artifact, source, small=1024, chunk=4096))))
        plan = "plan.msgpack.zst"
        assert (path / plan).read_bytes() == (gw.artifact / plan).read_bytes()
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0)
def _fetch(shipment: object) -> str:
    """What a slice actor does before it starts a worker: the node's verified copy."""
    import asyncio

    from medusa.serve.gateway.artifact_cache import ArtifactCache, Shipment, cache_root

    assert isinstance(shipment, Shipment)
    cache = ArtifactCache(cache_root(ray.get_runtime_context().get_node_id()))
    return str(asyncio.run(cache.ensure(shipment)))
