"""The gateway's Weaver pairing: which workers it pairs and unpairs (fake workers), and end to end
with two `medusa run` workers on tiny models: paired, the hot worker offloads and answers exactly
what it answered before; the cold model gets busy: unpaired, and the answers stay the same."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType as T

from medusa.serve.gateway.config import ConfigError, ModelConfig, load_config
from medusa.serve.gateway.instances import State
from medusa.serve.gateway.weaving import WeavingPairs
from medusa.weaver.choice import Candidate, WeavingProfile, expected_wait, rank_receivers
from medusa.weaver.config import WeavingConfig
from tests.engine.tiny_models import write_gguf
from tests.processes import without_medusa

MODELS = {
    "hot": ModelConfig("hot", weaving=WeavingConfig(enabled=True, ratio=0.5)),
    "cold": ModelConfig("cold", target=2),
    "other": ModelConfig("other", target=2),
}


@dataclass(eq=False)
class Fake:
    model: str
    port: int
    inflight: int = 0
    state: State = State.WARM
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return str(self.port)

    def connect(self, timeout: float) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=timeout)


def fake_pairs(
    refuse: set[tuple[int, str]],
    calls: list[tuple[int, str, dict]],
    described: dict[int, dict] | None = None,
) -> WeavingPairs:
    """Pairs whose workers answer 200, or 409 for (port, path) in `refuse`; `GET /weaving` answers
    described[port] (500 if the port is not there)."""

    def handle(req: httpx.Request) -> httpx.Response:
        port, path = req.url.port or 0, req.url.path
        if req.method == "GET":
            if port not in (described or {}):
                return httpx.Response(500, json={"error": {"message": "engine failed"}})
            return httpx.Response(200, json={"offloading": None, "receiving": None,
                                              **(described or {})[port]})  # fmt: skip
        calls.append((port, path, json.loads(req.content or b"{}")))
        if (port, path) in refuse:
            return httpx.Response(409, json={"error": {"message": "not enough free memory"}})
        return httpx.Response(200, json={})

    def client(w: Fake) -> httpx.AsyncClient:  # type: ignore[override]
        return httpx.AsyncClient(base_url=w.url, transport=httpx.MockTransport(handle))

    return WeavingPairs(MODELS, client=client)  # type: ignore[arg-type]


def test_pairs_a_hot_worker_with_an_idle_one_and_unpairs_when_it_gets_busy():
    calls: list[tuple[int, str, dict]] = []
    pairs = fake_pairs(set(), calls)
    hot, cold, other = Fake("hot", 1), Fake("cold", 2, inflight=1), Fake("other", 3)
    asyncio.run(pairs.tick([hot, cold, other]))
    region = "weaver-1"  # a name in the workers' private directory, never a path
    assert calls == [(1, "/weaving/offload", {"region": region, "ratio": 0.5}),
                     (3, "/weaving/receive", {"region": region, "blocks": 256})]  # fmt: skip
    calls.clear()
    asyncio.run(pairs.tick([hot, cold, other]))
    assert calls == []  # paired already
    other.inflight, cold.inflight = 2, 0  # `other` reaches its target: busy
    asyncio.run(pairs.tick([hot, cold, other]))
    assert [c[:2] for c in calls] == [(1, "/weaving/unpair"), (3, "/weaving/unpair"),
                                      (1, "/weaving/offload"), (2, "/weaving/receive")]  # fmt: skip
    calls.clear()
    asyncio.run(pairs.release(cold))  # the gateway stops `cold`: unpaired first
    assert [c[:2] for c in calls] == [(1, "/weaving/unpair"), (2, "/weaving/unpair")]
    assert pairs.pairs == []


def test_a_refusing_receiver_is_not_asked_again_soon_and_dead_workers_unpair():
    calls: list[tuple[int, str, dict]] = []
    pairs = fake_pairs({(2, "/weaving/receive")}, calls)
    hot, cold, other = Fake("hot", 1), Fake("cold", 2), Fake("other", 3, inflight=1)
    asyncio.run(pairs.tick([hot, cold, other]))
    assert [c[:2] for c in calls] == [(1, "/weaving/offload"), (2, "/weaving/receive"),
                                      (1, "/weaving/unpair")]  # fmt: skip
    calls.clear()
    other.inflight = 0
    asyncio.run(pairs.tick([hot, cold, other]))  # `cold` refused a moment ago: `other` instead
    assert [c[:2] for c in calls] == [(1, "/weaving/offload"), (3, "/weaving/receive")]
    calls.clear()
    other.state = State.DEAD
    asyncio.run(pairs.tick([hot, cold, other]))
    assert [c[:2] for c in calls][:2] == [(1, "/weaving/unpair"), (3, "/weaving/unpair")]


def described(ops: list[float], attention: float, free_gib: float) -> dict:
    return {"profile": {"ops": ops, "attention": attention}, "free_bytes": int(free_gib * 2**30)}


def test_the_receiver_is_the_one_the_hot_model_would_wait_least_on_ties_by_free_memory():
    """hot (ratio 0.5) has K = N = 0.5 ms of attention per layer: a task waits about half the
    receiver kernel it lands in. `long` has 2 ms kernels (most memory), `short` and `short2`
    0.1 ms ones (a tie, `short2` with more memory), `mute` gives no profile."""
    hot, long_, short, short2, mute = (Fake("hot", 1), Fake("cold", 2), Fake("cold", 3),
                                       Fake("other", 4), Fake("other", 5))  # fmt: skip
    times = {1: described([1e-4] * 30, 1e-3, 4), 2: described([2e-3] * 10, 9e-4, 12),
             3: described([1e-4] * 200, 1e-4, 1), 4: described([1e-4] * 80, 2e-4, 3)}  # fmt: skip
    for refuse, want in [(set(), [4]), ({(4, "/weaving/receive")}, [4, 3])]:
        calls: list[tuple[int, str, dict]] = []
        pairs = fake_pairs(refuse, calls, times)
        asyncio.run(pairs.tick([hot, mute, long_, short, short2]))
        tried = [c[0] for c in calls if c[1] == "/weaving/receive"]
        assert tried == want  # mute (no profile) and long (most memory) are never tried first
        assert len(pairs.pairs) == 1 and pairs.pairs[0].cold.port == want[-1]
    hot_p = WeavingProfile.from_json(times[1]["profile"])
    waits = [expected_wait(hot_p, 0.5, WeavingProfile.from_json(times[p]["profile"]))
             for p in (2, 3)]  # fmt: skip
    assert waits == pytest.approx([1e-3, 5e-5])  # T/2 per task: 2 ms kernels vs 0.1 ms ones
    # without the hot worker's profile: by free memory alone; the mute one still last
    cands = [Candidate(w, WeavingProfile.from_json(times[w.port]["profile"]),
                       times[w.port]["free_bytes"]) for w in (short, long_, short2)]  # fmt: skip
    assert rank_receivers(None, 0.5, [Candidate(mute, None, 0), *cands]) == [
        long_, short2, short, mute]  # fmt: skip


def test_models_yaml_weaving_is_parsed_and_checked(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  a:\n    weaving: {enabled: true, ratio: 0.4}\n  b: {}\n")
    cfg = load_config(path)
    assert (
        cfg.models["a"].weaving == WeavingConfig(True, 0.4) and not cfg.models["b"].weaving.enabled
    )
    path.write_text("models:\n  a:\n    weaving: {ratio: 1.5}\n")
    with pytest.raises(ConfigError, match=r"models\.a\.weaving\.ratio: 1\.5"):
        load_config(path)


# ---- end to end: two worker processes ----
PROMPTS = [[(5 * i + j) % 250 + 1 for j in range(4 + 3 * i)] for i in range(6)]
ENGINE = {"max_num_seqs": 8, "max_model_len": 128, "max_num_batched_tokens": 128,
          "kv_cache_memory": 4 << 20}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TOKEN = "pairing-test-token"
HEADERS = {"x-medusa-worker-token": TOKEN}


def start_worker(model: Path, name: str, regions: Path) -> tuple[subprocess.Popen[str], int]:
    """A worker as the gateway starts one: its token, and the gateway's directory of regions."""
    port = _free_port()
    cmd = [sys.executable, "-m", "medusa.cli", "run", str(model), "--port", str(port),
           "--served-model-name", name]  # fmt: skip
    for k, v in ENGINE.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    env = without_medusa(os.environ)
    env |= {"MEDUSA_WORKER_TOKEN": TOKEN, "MEDUSA_WEAVING_DIR": str(regions)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    return proc, port


def wait_healthy(proc: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, headers=HEADERS)
            if r.status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the worker on port {port} did not become healthy")


async def complete_all(port: int, name: str) -> list[str]:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=120, headers=HEADERS
    ) as c:
        rs = await asyncio.gather(*(
            c.post("/v1/completions", json={"model": name, "prompt": p, "max_tokens": 8,
                                            "temperature": 0})
            for p in PROMPTS))  # fmt: skip
    return [r.json()["choices"][0]["text"] for r in rs]


@pytest.mark.e2e
def test_two_workers_paired_then_unpaired_answer_as_without_offload(tmp_path, shm_path):
    hot_model, cold_model = tmp_path / "hot.gguf", tmp_path / "cold.gguf"
    write_gguf(hot_model, [T.F32], seed=0)
    write_gguf(cold_model, [T.F32], seed=1)
    regions = shm_path / "regions"  # on tmpfs, as a gateway's (tests/conftest.py says why)
    regions.mkdir(mode=0o700)
    (hp, hport) = start_worker(hot_model, "hot", regions)
    (cp, cport) = start_worker(cold_model, "cold", regions)
    try:
        wait_healthy(hp, hport)
        wait_healthy(cp, cport)
        want = asyncio.run(complete_all(hport, "hot"))  # not paired yet: all local
        hot, cold = Fake("hot", hport, headers=HEADERS), Fake("cold", cport, headers=HEADERS)
        pairs = WeavingPairs(MODELS)
        asyncio.run(pairs.tick([hot, cold]))
        assert len(pairs.pairs) == 1
        assert asyncio.run(complete_all(hport, "hot")) == want
        status = httpx.get(f"http://127.0.0.1:{hport}/weaving", headers=HEADERS).json()
        status = status["offloading"]
        assert status["num_offloaded"] == len(PROMPTS) // 2 and status["error"] is None
        got = httpx.get(f"http://127.0.0.1:{cport}/weaving", headers=HEADERS).json()
        assert got["receiving"]["served"] > 0
        cold.inflight = 2  # the cold model gets busy
        asyncio.run(pairs.tick([hot, cold]))
        assert pairs.pairs == [] and list(regions.iterdir()) == []  # the region file went too
        for port in (hport, cport):
            got = httpx.get(f"http://127.0.0.1:{port}/weaving", headers=HEADERS).json()
            assert got["offloading"] is None and got["receiving"] is None
            assert len(got["profile"]["ops"]) > 10 and got["free_bytes"] > 0
        assert asyncio.run(complete_all(hport, "hot")) == want  # unpaired: all local again
    finally:
        for p in (hp, cp):
            p.terminate()
            p.wait(timeout=30)
