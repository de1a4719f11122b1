"""Findings 5 and 13 at a worker (`medusa run`, reachable as its user runs it): slow clients are
displaced and timed out, an oversized head is refused; a request's stop list, messages,
max_tokens and seed are bounded (a 340,000-entry stop list once burnt 18 s of the event loop for
100 tokens), each refusal an OpenAI-shaped 400 that names the limit; /docs and /openapi.json are
off."""

from __future__ import annotations

import httpx
import pytest

from tests.security._net import (
    TINY_ARGS,
    answer_of,
    free_port,
    half_sent,
    start_worker,
    stop,
    tiny_model,
    wait_health,
)

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    model = tiny_model(tmp_path_factory.mktemp("tiny"))
    port = free_port()
    proc = start_worker(
        str(model), "--port", str(port), *TINY_ARGS, "--served-model-name", "tiny",
        "--max-connections", "16", "--header-timeout", "2", "--body-timeout", "2",
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_health(proc, base)
    yield base, port
    stop(proc)


def _refused(base: str, route: str, **fields: object) -> str:
    body = {"model": "tiny", **fields}
    r = httpx.post(f"{base}{route}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (
        set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    )
    return f"{err['param']}: {err['message']}"


def test_unbounded_request_fields_are_refused_naming_the_limit(worker):
    base, _ = worker
    ask = {"prompt": [5, 6, 7], "max_tokens": 2}
    stops = [f"s{i}" for i in range(340_000)]
    assert "at most 16 stop sequences, not 340000" in _refused(
        base, "/v1/completions", **ask, stop=stops
    )
    assert "at most 16 stop sequences" in _refused(base, "/v1/completions", **ask, stop=stops[:17])
    assert "at most 256 characters" in _refused(base, "/v1/completions", **ask, stop="x" * 257)
    ok = httpx.post(f"{base}/v1/completions", json={"model": "tiny", **ask,
                    "stop": ["y" * 256] * 16}, timeout=60)  # fmt: skip
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    assert "max_tokens" in _refused(base, "/v1/completions", prompt=[5], max_tokens=(1 << 20) + 1)
    assert "seed" in _refused(base, "/v1/completions", **ask, seed=1 << 64)
    assert "model" in _refused(base, "/v1/completions", **{**ask, "model": "m" * 257})
    many = [{"role": "user", "content": "hi"}] * 4097
    assert "at most 4096 items" in _refused(base, "/v1/chat/completions", messages=many)
    for route in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(f"{base}{route}").status_code == 404


def test_slow_clients_are_displaced_and_timed_out(worker):
    base, port = worker
    conns = half_sent(port, 40)  # more than --max-connections 16
    try:
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}
        assert httpx.post(f"{base}/v1/completions", json=body, timeout=60).status_code == 200
        assert answer_of(conns[0], 1).startswith(b"HTTP/1.1 503 ")
        assert answer_of(conns[-1], 6).startswith(b"HTTP/1.1 408 ")
        huge = half_sent(port, 1, b"GET /health HTTP/1.1\r\nX: " + b"a" * (70 << 10))[0]
        assert answer_of(huge, 5).startswith(b"HTTP/1.1 431 ")
        slow_body = half_sent(port, 1, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: 50\r\n\r\n{")[0]  # fmt: skip
        assert answer_of(slow_body, 6).startswith(b"HTTP/1.1 408 ")
        assert httpx.get(f"{base}/health").status_code == 200
    finally:
        for c in conns:
            c.close()
