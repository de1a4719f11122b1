"""`medusa gateway`: scale from zero onto simulated slices, a bounded queue, a worker that dies
mid-request, the openai client, config and placement errors, API keys."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import time

import httpx
import openai
import pytest

from medusa.child import medusa_cli
from medusa.serve.gateway.config import ConfigError, load_config
from medusa.serve.gateway.placement import check_placement
from medusa.serve.gateway.slices import simulated_slices
from tests.processes import clean_env

ENGINE = (
    "{max_num_seqs: 4, max_model_len: 256, max_num_batched_tokens: 128, "
    "gpu_memory_utilization: 0.4}"
)
CHAT = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
    "max_tokens": 12,
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp_path, artifact, extra: str = "") -> str:
    (tmp_path / "slices.yaml").write_text(
        "slices:\n  - {name: s0, memory_gb: 8}\n  - {name: s1, memory_gb: 8}\n"
    )
    (tmp_path / "models.yaml").write_text(f"""
models:
  a: {{artifact: {artifact}, keep_alive: 5, max_queue: 3, target: 1, engine: {ENGINE}}}
  b: {{artifact: {artifact}, keep_alive: 5, engine: {ENGINE}}}
slices: slices.yaml
{extra}""")
    return str(tmp_path / "models.yaml")


@pytest.fixture(scope="module")
def gateway(engine_artifact, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("gw")
    proc, base = _start_gateway(_config(tmp, engine_artifact))
    yield base
    proc.send_signal(signal.SIGTERM)  # graceful drain: workers are stopped too
    out, _ = proc.communicate(timeout=60)
    assert "draining" in out


def _state(base: str) -> dict[str, str]:
    return {m["id"]: m["state"] for m in httpx.get(f"{base}/v1/models").json()["data"]}


def _start_gateway(config: str) -> tuple[subprocess.Popen[str], str]:
    port = _port()
    proc = subprocess.Popen(
        medusa_cli("gateway", "--config", config, "--port", str(port)),
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the gateway did not start:\n{proc.communicate()[0]}")


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, or a pid that is gone, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and _alive(pid):
        time.sleep(0.1)
    return not _alive(pid)


def _worker_pid(base: str, model: str, key: str = "", timeout: float = 30) -> int:
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.time() + timeout
    while time.time() < deadline:
        insts = httpx.get(f"{base}/admin/instances", headers=auth).json()[model]
        if insts:
            return int(insts[0]["pid"])
        time.sleep(0.1)
    raise AssertionError(f"no worker started for {model}")


def _wait_cold(base: str, timeout: float = 20) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and set(_state(base).values()) != {"cold"}:
        time.sleep(0.2)
    assert set(_state(base).values()) == {"cold"}


@pytest.mark.e2e
def test_scale_from_zero_a_second_model_and_back_to_zero(gateway):
    assert _state(gateway) == {"a": "cold", "b": "cold"}

    def ask(model: str) -> httpx.Response:
        body = {"model": model, **CHAT}
        return httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=120)

    # both at once: both are warm afterwards (a keep_alive of 5 s outlasts no cold start here)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.map(ask, ("a", "b"))
    assert a.status_code == 200 and "Paris" in a.json()["choices"][0]["message"]["content"]
    assert b.status_code == 200 and _state(gateway) == {"a": "warm", "b": "warm"}
    slices = {m: i[0]["slice"] for m, i in httpx.get(f"{gateway}/admin/instances").json().items()}
    assert slices["a"] != slices["b"]  # one worker per slice
    metrics = httpx.get(f"{gateway}/metrics").text
    assert 'medusa_gateway_cold_starts_total{model="a"} 1.0' in metrics
    assert 'medusa_gateway_cold_start_stage_seconds{model="a",stage="graph_restore"}' in metrics
    _wait_cold(gateway)  # keep_alive is 5 s
    assert httpx.get(f"{gateway}/admin/instances").json() == {"a": [], "b": []}


@pytest.mark.e2e
def test_a_burst_beyond_max_queue_gets_429_and_the_rest_are_answered(gateway):
    _wait_cold(gateway)

    def ask(_: int) -> httpx.Response:
        return httpx.post(
            f"{gateway}/v1/chat/completions", json={"model": "a", **CHAT}, timeout=120
        )

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = [r.status_code for r in pool.map(ask, range(8))]
    assert codes.count(429) == 5 and codes.count(200) == 3


@pytest.mark.e2e
def test_a_worker_killed_mid_request_is_retried_and_its_slice_freed(gateway):
    long = {
        "model": "a",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "temperature": 0,
        "max_tokens": 150,
    }
    httpx.post(f"{gateway}/v1/chat/completions", json={"model": "a", **CHAT}, timeout=120)
    (first,) = httpx.get(f"{gateway}/admin/instances").json()["a"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(httpx.post, f"{gateway}/v1/chat/completions", json=long, timeout=120)
        time.sleep(1.0)
        os.kill(first["pid"], signal.SIGKILL)
        r = fut.result()
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
    (second,) = httpx.get(f"{gateway}/admin/instances").json()["a"]
    assert second["pid"] != first["pid"]


@pytest.mark.e2e
def test_the_openai_client_works_through_the_gateway(gateway):
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused")
    r = client.chat.completions.create(model="b", **CHAT)
    assert "Paris" in r.choices[0].message.content
    chunks = list(client.chat.completions.create(model="b", stream=True, **CHAT))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="zzz", **CHAT)


@pytest.mark.e2e
def test_a_stream_cut_by_a_dying_worker_raises_in_the_openai_client(gateway):
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)
    long = [{"role": "user", "content": "Tell me a long story."}]
    stream = client.chat.completions.create(
        model="b", messages=long, temperature=0, max_tokens=200, stream=True
    )
    with pytest.raises(openai.APIError, match="the worker stopped in the middle"):
        for i, _ in enumerate(stream):
            if i == 2:
                os.kill(_worker_pid(gateway, "b"), signal.SIGKILL)


@pytest.mark.e2e
def test_workers_answer_only_the_gateway_and_a_warm_queue_is_bounded(gateway):
    ok = httpx.post(f"{gateway}/v1/chat/completions", json={"model": "a", **CHAT}, timeout=120)
    assert ok.status_code == 200
    (inst,) = httpx.get(f"{gateway}/admin/instances").json()["a"]
    uds = inst["address"].removeprefix("unix:")
    with httpx.Client(transport=httpx.HTTPTransport(uds=uds)) as worker:
        direct = worker.get("http://worker/v1/models")
    assert direct.status_code == 401 and direct.json()["error"]["code"] == "invalid_worker_token"

    # a: target 1, max_queue 3: one request in the worker's batch and three beyond it
    long = {**CHAT, "model": "a", "max_tokens": 40, "messages": [
        {"role": "user", "content": "Tell me a long story."}]}  # fmt: skip

    def ask(_: int) -> httpx.Response:
        return httpx.post(f"{gateway}/v1/chat/completions", json=long, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(ask, range(6)))
    codes = [r.status_code for r in answers]
    assert set(codes) <= {200, 429} and codes.count(200) >= 4 and codes.count(429) >= 1, codes
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.headers["retry-after"] and refused.json()["error"]["code"] == "queue_full"


@pytest.mark.e2e
def test_a_worker_that_cannot_start_is_tried_a_few_times_then_refused_with_its_reason(
    tmp_path,
    engine_artifact,  # noqa: F811
):
    (tmp_path / "slices.yaml").write_text(
        "slices:\n  - {name: s0, memory_gb: 8}\n  - {name: s1, memory_gb: 8}\n"
    )
    (tmp_path / "models.yaml").write_text(f"""
models:
  broken: {{engine: {{gpu_memory_utilization: 0.01}}, start_attempts: 2, failure_cooldown: 4}}
  ok: {{artifact: {engine_artifact}, engine: {ENGINE}}}
slices: slices.yaml
""")
    proc, base = _start_gateway(str(tmp_path / "models.yaml"))
    try:
        t0 = time.time()
        r = httpx.post(f"{base}/v1/chat/completions", json={"model": "broken", **CHAT}, timeout=60)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "model_start_failed"
        assert "failed to start 2 times" in err["message"]
        assert "gpu_memory_utilization=0.01 leaves" in err["message"]  # the worker's stderr
        assert "raise --gpu-memory-utilization" in err["message"]
        (entry,) = [m for m in httpx.get(f"{base}/v1/models").json()["data"] if m["id"] == "broken"]
        assert entry["state"] == "failed" and "gpu_memory_utilization" in entry["error"]
        again = httpx.post(f"{base}/v1/chat/completions", json={"model": "broken", **CHAT})
        assert again.status_code == 503 and time.time() - t0 < 30
        time.sleep(4)  # the cool-down: the next request may try again
        assert _state(base)["broken"] == "cold"

        # SIGTERM while a worker starts and a request waits for it: all of it ends
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            queued = pool.submit(
                httpx.post, f"{base}/v1/chat/completions", json={"model": "ok", **CHAT}, timeout=60
            )
            pid = _worker_pid(base, "ok")
            proc.send_signal(signal.SIGTERM)
            waited = queued.result()
        assert waited.status_code == 503 and waited.json()["error"]["code"] == "shutting_down"
        out, _ = proc.communicate(timeout=30)
        assert not _alive(pid)
    finally:
        proc.kill()
    assert out.count("starting broken") == 2, out


@pytest.mark.e2e
def test_workers_die_with_a_killed_gateway(tmp_path, engine_artifact):  # noqa: F811
    proc, base = _start_gateway(_config(tmp_path, engine_artifact, "api_keys: [k]"))
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(
                httpx.post,
                f"{base}/v1/chat/completions",
                json={"model": "a", **CHAT},
                headers={"Authorization": "Bearer k"},
                timeout=60,
            )
            pid = _worker_pid(base, "a", key="k")
            proc.kill()
        assert _wait_gone(pid, 30), f"worker {pid} outlived its gateway"
    finally:
        proc.kill()
        proc.wait()
        if "pid" in locals() and _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.e2e
def test_config_errors_name_the_field(tmp_path, engine_artifact):  # noqa: F811
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  a: {max_instances: 0}\n")
    with pytest.raises(ConfigError, match=r"models\.a\.max_instances: expected an integer >= 1"):
        load_config(bad)
    bad.write_text("models:\n  a: {artifact: /nonexistent}\n")
    with pytest.raises(ConfigError, match=r"models\.a\.artifact: /nonexistent is not a directory"):
        load_config(bad)
    bad.write_text("models:\n  a: {engine: {max_num_sequences: 4}}\n")
    with pytest.raises(ConfigError, match=r"models\.a\.engine: unknown setting"):
        load_config(bad)
    cfg = load_config(_config(tmp_path, engine_artifact))
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("slices:\n  - {profile: 1g.12gb, memory_gb: 0.25}\n")
    with pytest.raises(
        ConfigError, match=r"models\.a: needs about .* GiB .* largest slice has 0\.2"
    ):
        check_placement(cfg, simulated_slices(tiny))


@pytest.mark.e2e
def test_api_keys_guard_the_public_routes(tmp_path, engine_artifact):  # noqa: F811
    from fastapi.testclient import TestClient

    from medusa.serve.gateway.app import create_gateway

    cfg = load_config(_config(tmp_path, engine_artifact, "api_keys: [sekrit]"))
    slices = simulated_slices(tmp_path / "slices.yaml")
    with TestClient(create_gateway(cfg, slices, max_body_bytes=1000)) as c:
        key = {"Authorization": "Bearer sekrit"}
        for route in ("/v1/models", "/admin/instances"):
            assert c.get(route).status_code == 401
            assert c.get(route, headers=key).status_code == 200
        assert len(c.get("/v1/models", headers=key).json()["data"]) == 2
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        assert c.post("/v1/completions", json={"model": "a"}).status_code == 401

        # errors are OpenAI-shaped, with the codes the worker uses
        unknown = c.post("/v1/completions", json={"model": "zzz", "prompt": "x"}, headers=key)
        assert unknown.status_code == 404
        assert unknown.json()["error"] | {"message": ""} == {
            "message": "", "type": "invalid_request_error", "param": "model",
            "code": "model_not_found",
        }  # fmt: skip
        bad = c.post("/v1/completions", content=b'{"model": "a",', headers=key)
        msg = bad.json()["error"]["message"]
        assert bad.status_code == 400 and msg.startswith("the request body is not valid JSON: ")
        big = c.post("/v1/completions", json={"model": "a", "prompt": "x" * 2000}, headers=key)
        assert big.status_code == 413 and "larger than 1000 bytes" in big.json()["error"]["message"]


@pytest.mark.e2e
def test_the_runtime_examples_are_valid(tmp_path):
    from pathlib import Path

    import yaml

    runtime = Path(__file__).parents[2] / "runtime"
    assert len(simulated_slices(runtime / "slices.yaml")) == 3
    for name in ("models.yaml", "gateway-models.yaml", "compose.yaml"):
        assert isinstance(yaml.safe_load((runtime / name).read_text()), dict)
    # models.yaml validates once the artifact it names exists
    (tmp_path / "artifacts" / "smollm2-sim").mkdir(parents=True)
    (tmp_path / "runtime").mkdir()
    for name in ("models.yaml", "slices.yaml"):
        (tmp_path / "runtime" / name).write_text((runtime / name).read_text())
    cfg = load_config(tmp_path / "runtime" / "models.yaml")
    assert cfg.models["smollm2"].max_queue == 32 and cfg.models["smollm2-eager"].engine
    assert cfg.pool_size("8gb.26sm") == 1
    res = subprocess.run(
        ["sh", str(runtime / "entrypoint.sh")],
        env={"MEDUSA_ROLE": "nope"},
        capture_output=True,
        text=True,
    )
    assert (
        res.returncode == 2 and "MEDUSA_ROLE must be worker, gateway or materialize" in res.stderr
    )


def test_c2c_admission_refuses_host_weights_that_oversubscribe_the_link(tmp_path):
    lines = ["models:"] + [
        f"  m{i}: {{tpot_target: 0.001, engine: {{weights: host}}}}" for i in range(3)
    ]
    (tmp_path / "slices.yaml").write_text("slices:\n  - {name: s0, memory_gb: 8}\n")
    (tmp_path / "models.yaml").write_text("\n".join(lines) + "\nslices: slices.yaml\n")
    cfg = load_config(tmp_path / "models.yaml")
    with pytest.raises(ConfigError, match=r"need \d+ GB/s of C2C \(m0 \d+ GB/s, m1"):
        check_placement(cfg, simulated_slices(tmp_path / "slices.yaml"))


def test_host_weight_models_get_a_prefill_chunk_from_the_profile_table(tmp_path):
    from medusa.serve.gateway.placement import plan_chunks

    (tmp_path / "slices.yaml").write_text(
        "slices:\n  - {profile: 1g.12gb}\n  - {profile: 1g.12gb}\n"
    )
    (tmp_path / "models.yaml").write_text(
        "models:\n"
        "  fast: {ttft_target: 0.02, engine: {weights: host, max_model_len: 4096}}\n"
        "  slow: {ttft_target: 5.0, engine: {weights: host, max_model_len: 4096}}\n"
        "  pinned: {engine: {weights: host, max_prefill_chunk: 64}}\n"
        "  plain: {}\nslices: slices.yaml\n"
    )
    cfg = plan_chunks(
        load_config(tmp_path / "models.yaml"), simulated_slices(tmp_path / "slices.yaml")
    )
    chunk = {name: m.engine.get("max_prefill_chunk") for name, m in cfg.models.items()}
    assert chunk["pinned"] == 64 and chunk["plain"] is None
    # a loose TTFT target is met by small chunks (less activation memory), a tight one by big ones
    assert chunk["slow"] == 128 and chunk["fast"] > chunk["slow"]
    assert "--max-prefill-chunk" in cfg.models["fast"].worker_args()


@pytest.mark.e2e
def test_the_gateway_logs_a_cold_starts_stages_as_they_happen(tmp_path):
    (tmp_path / "models.yaml").write_text(
        f"models:\n  m: {{engine: {ENGINE}}}\nslices: [{{name: s0, memory_gb: 8}}]\n"
    )
    proc, base = _start_gateway(str(tmp_path / "models.yaml"))
    try:
        r = httpx.post(f"{base}/v1/chat/completions", json={"model": "m", **CHAT}, timeout=120)
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        log = proc.communicate(timeout=60)[0]
    lines = [line.split(" medusa.gateway ", 1)[1] for line in log.splitlines()
             if " medusa.gateway " in line]  # fmt: skip
    (start,) = [i for i, line in enumerate(lines) if line.startswith("starting m on slice s0")]
    pid = lines[start].rsplit("worker pid ", 1)[1].rstrip(")")
    stages = [line.split(": ", 1)[1] for line in lines if line.startswith(f"m (worker pid {pid} ")]
    # each logged once, in start-up order (a stage shorter than one health poll may go unseen)
    assert "loading the weights" in stages and "profiling the KV-cache size" in stages
    assert stages.index("loading the weights") < stages.index("profiling the KV-cache size")
    assert len(stages) == len(set(stages))
    ready = [i for i, line in enumerate(lines) if line.startswith("m ready on s0 in ")]
    assert ready and ready[0] > lines.index(f"m (worker pid {pid} on s0): loading the weights")
