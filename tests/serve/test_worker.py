"""`medusa run`: the official openai client talks to the worker unchanged; errors are
OpenAI-shaped with the right status; health and metrics."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.processes import without_medusa


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "medusa.cli",
        "run",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--max-num-batched-tokens",
        "256",
        "--max-num-seqs",
        "4",
    ]
    env = without_medusa(os.environ)
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"medusa run exited {proc.returncode}:\n{proc.stdout.read()}")
        time.sleep(0.3)
    else:
        proc.kill()
        raise AssertionError("the worker did not become healthy in 120 s")
    yield base
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert "engine.startup kv_profile" in out  # the start-up stages are logged
    assert "profiled (a forward pass at the largest batch)" in out  # and how the KV size came


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused")


@pytest.mark.e2e
def test_chat_completion_through_the_openai_client(client):
    r = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=16,
    )
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0


@pytest.mark.e2e
def test_streamed_chat_equals_the_unstreamed_answer(client):
    msgs = [{"role": "user", "content": "Name a colour."}]
    full = client.chat.completions.create(
        model="smollm2", messages=msgs, temperature=0, max_tokens=12
    )
    stream = client.chat.completions.create(
        model="smollm2", messages=msgs, temperature=0, max_tokens=12, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


@pytest.mark.e2e
def test_completion_with_stop_and_streaming(client):
    r = client.completions.create(
        model="smollm2", prompt="1, 2, 3, 4,", temperature=0, max_tokens=12
    )
    assert r.choices[0].text.startswith(" 5")
    cut = client.completions.create(
        model="smollm2", prompt="1, 2, 3, 4,", temperature=0, max_tokens=12, stop=[" 7"]
    )
    assert cut.choices[0].text == r.choices[0].text.split(" 7")[0]
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="smollm2",
            prompt="1, 2, 3, 4,",
            temperature=0,
            max_tokens=12,
            stop=[" 7"],
            stream=True,
        )
    )
    assert streamed == cut.choices[0].text


@pytest.mark.e2e
def test_errors_are_openai_shaped(client, server):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    assert "smollm2" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt="word " * 400)
    assert "at most 255" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="smollm2", prompt="x", temperature=-1)
    bad = httpx.post(
        f"{server}/v1/completions", content=b"{bad", headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]


@pytest.mark.e2e
def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list()] == ["smollm2"]
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    client.completions.create(model="smollm2", prompt="Hi", max_tokens=2)
    text = httpx.get(f"{server}/metrics").text
    assert 'medusa_startup_seconds{stage="kv_profile"}' in text
    assert 'medusa_kv_cache_blocks{source="profiled"}' in text
    assert "medusa_ttft_seconds_count" in text and "medusa_queue_length" in text


def _prefill_steps(server: str) -> dict[str, float]:
    found = re.findall(
        r'^medusa_prefill_steps\{ran="(\w+)"\} (\S+)$', httpx.get(f"{server}/metrics").text, re.M
    )
    return {ran: float(n) for ran, n in found}


@pytest.mark.e2e
def test_a_short_prompt_prefills_eagerly_a_longer_one_by_its_graph(client, server):
    """Prefill graphs here are for 64, 128 and 256 tokens: a 2-token prompt padded to 64 would
    cost 32 prompts' compute on a CPU, so it runs eagerly; 40 tokens replay the 64 graph."""
    before = _prefill_steps(server)
    client.completions.create(model="smollm2", prompt=[100, 101], max_tokens=1)
    after_short = _prefill_steps(server)
    assert after_short["eager"] == before.get("eager", 0) + 1
    assert after_short["graph"] == before.get("graph", 0)
    client.completions.create(model="smollm2", prompt=list(range(100, 140)), max_tokens=1)
    after_long = _prefill_steps(server)
    assert after_long["graph"] == after_short["graph"] + 1
    assert after_long["eager"] == after_short["eager"]


def _post(server: str, route: str, raw: bytes) -> httpx.Response:
    return httpx.post(
        f"{server}{route}", content=raw, headers={"content-type": "application/json"}, timeout=60
    )


def _openai_error(r: httpx.Response, status: int, param: str | None = None) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    return str(err["message"])


@pytest.mark.e2e
def test_input_that_is_not_text_or_not_a_number_is_refused(server):
    surrogate = rb'{"model": "smollm2", "prompt": "a\ud800b", "max_tokens": 2}'
    msg = _openai_error(_post(server, "/v1/completions", surrogate), 400, "prompt")
    assert "lone surrogate" in msg
    chat = rb'{"model": "smollm2", "messages": [{"role": "user", "content": "a\udfffb"}]}'
    _openai_error(_post(server, "/v1/chat/completions", chat), 400, "messages.0.content")
    for number in (b"NaN", b"Infinity", b"-Infinity"):
        body = b'{"model": "smollm2", "prompt": "x", "temperature": %s}' % number
        msg = _openai_error(_post(server, "/v1/completions", body), 400)
        assert f"{number.decode()} is not a JSON number" in msg
    huge = b'{"model": "smollm2", "prompt": "x", "temperature": 1e999}'
    _openai_error(_post(server, "/v1/completions", huge), 400, "temperature")


@pytest.mark.e2e
def test_chat_fields_a_model_cannot_honour_are_refused(server):
    def chat(**kw: object) -> httpx.Response:
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **kw}
        return httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)

    msg = _openai_error(chat(max_tokens=0), 400, "max_tokens")
    assert "greater than or equal to 1" in msg
    _openai_error(chat(max_completion_tokens=0), 400, "max_completion_tokens")
    robot = {"model": "smollm2", "messages": [{"role": "robot", "content": "hi"}]}
    r = httpx.post(f"{server}/v1/chat/completions", json=robot, timeout=60)
    assert "'user'" in _openai_error(r, 400, "messages.0.role")
    r = chat(messages=[{"role": "developer", "content": "Be brief."}], max_tokens=2)
    assert r.status_code == 200


@pytest.mark.e2e
def test_bodies_that_do_not_parse_get_openai_shaped_errors(server):
    msg = _openai_error(_post(server, "/v1/completions", b'{"model": "smollm2",'), 400)
    assert msg.startswith("the request body is not valid JSON: Expecting") and "{" not in msg
    assert "must be a JSON object" in _openai_error(_post(server, "/v1/completions", b"[1]"), 400)
    assert "UTF-8" in _openai_error(_post(server, "/v1/completions", b'"\xff"'), 400)
    deep = _post(server, "/v1/completions", b"[" * 200_000)
    assert "nests arrays or objects too deeply" in _openai_error(deep, 400)
    _openai_error(httpx.get(f"{server}/v1/nothing"), 404)
    _openai_error(httpx.get(f"{server}/v1/completions"), 405)


@pytest.mark.e2e
def test_a_body_over_the_cap_is_refused_and_a_long_prompt_does_not_stall_streams(server):
    big = json.dumps({"model": "smollm2", "prompt": "x" * (5 << 20)}).encode()
    r = _post(server, "/v1/completions", big)
    assert "larger than 4194304 bytes" in _openai_error(r, 413)
    chunked = httpx.post(
        f"{server}/v1/completions", content=iter([big[: 3 << 20], big[3 << 20 :]]), timeout=60
    )
    _openai_error(chunked, 413)

    # Tokenizing a prompt near the cap takes seconds: meanwhile the server keeps answering.
    long_prompt = {"model": "smollm2", "prompt": "word " * 800_000, "max_tokens": 1}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        refused = pool.submit(httpx.post, f"{server}/v1/completions", json=long_prompt, timeout=60)
        time.sleep(0.5)
        answered = 0
        while not refused.done():
            answered += httpx.get(f"{server}/health", timeout=60).status_code == 200
            time.sleep(0.05)
    assert "tokens; this engine takes at most" in _openai_error(refused.result(), 400, "prompt")
    assert answered >= 3


def test_a_worker_token_keeps_out_callers_other_than_the_gateway():
    from fastapi.testclient import TestClient

    from medusa.engine.config import EngineConfig
    from medusa.serve.api_server import create_app
    from medusa.serve.async_engine import AsyncEngine

    engine = AsyncEngine(EngineConfig())  # never started: /health says "starting"
    with TestClient(create_app(engine, "smollm2", token="t0k")) as c:
        assert "only its gateway" in _openai_error(c.get("/health"), 401)
        wrong = c.get("/health", headers={"x-medusa-worker-token": "nope"})
        _openai_error(wrong, 401)
        assert c.get("/health", headers={"x-medusa-worker-token": "t0k"}).status_code == 503
    with TestClient(create_app(engine, "smollm2", token="")) as c:
        starting = c.get("/health")  # no token: open, as `medusa run` is
        assert starting.status_code == 503
        assert starting.json() == {"status": "starting", "stage": "starting"}


@pytest.mark.e2e  # the whole engine on SmolLM2: tens of seconds
def test_an_engine_that_fails_while_serving_tells_its_requests_and_health():
    """A step that raises (say, weights a request needed could not be loaded) ends the request in
    flight with the reason, fails /health so the gateway replaces the worker, and refuses the
    requests after it: none of them waits forever."""
    from fastapi.testclient import TestClient

    from medusa.engine.config import EngineConfig
    from medusa.engine.llm_engine import LLMEngine
    from medusa.serve.api_server import create_app
    from medusa.serve.async_engine import AsyncEngine

    cfg = EngineConfig(max_model_len=256, max_num_batched_tokens=128, max_num_seqs=2)

    def broken_engine(on_stage: Callable[[str], None]) -> LLMEngine:
        e = LLMEngine(cfg, on_stage=on_stage)

        def step() -> list:
            raise RuntimeError("chunk 7 of the weight store could not be loaded")

        e.step = step  # type: ignore[method-assign]
        return e

    engine = AsyncEngine(cfg, broken_engine)
    engine.start()
    assert engine.ready.wait(120) and engine.error is None
    body = {"model": "smollm2", "prompt": "Hello", "max_tokens": 4}
    try:
        with TestClient(create_app(engine, "smollm2")) as c:
            with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                events = [line for line in r.iter_lines() if line.startswith("data: ")]
            err = json.loads(events[-1][len("data: ") :])["error"]
            assert "chunk 7 of the weight store" in err["message"], events
            health = c.get("/health")
            assert health.status_code == 500 and "chunk 7" in health.json()["error"]
            later = _openai_error(c.post("/v1/completions", json=body), 503)
            assert "the engine failed: a step failed" in later and "chunk 7" in later
    finally:
        engine.shutdown()
