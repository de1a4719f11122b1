"""`medusa run`: the official openai client talks to the worker unchanged; errors are
OpenAI-shaped with the right status; health and metrics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDUSA_")}
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


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused")


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


def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list()] == ["smollm2"]
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    client.completions.create(model="smollm2", prompt="Hi", max_tokens=2)
    text = httpx.get(f"{server}/metrics").text
    assert 'medusa_startup_seconds{stage="kv_profile"}' in text
    assert "medusa_ttft_seconds_count" in text and "medusa_queue_length" in text
