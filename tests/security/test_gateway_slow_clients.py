"""Finding 5: slow clients cannot take the gateway's descriptors. Run with few descriptors (as a
20,000-connection attack meets the usual limit), the gateway holds at most --max-connections
(lowered to fit), displaces the slowest half-sent requests for new clients, times out heads and
bodies that do not arrive, and a keyed request for a cold model (a worker to start: sockets,
pipes) is answered correctly meanwhile."""

from __future__ import annotations

import httpx
import pytest

from tests.security._net import (
    KEY,
    TINY_ENGINE,
    answer_of,
    gateway_config,
    half_sent,
    nofile,
    raise_nofile,
    start_gateway,
    stop,
    tiny_model,
)

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

LIMIT = 512  # descriptors the gateway may open (soft and hard)
ATTACKERS = 900  # half-sent requests: more than the gateway could hold


def test_half_sent_requests_do_not_keep_out_a_keyed_client(tmp_path):
    raise_nofile(ATTACKERS + 200)
    models = f"  a: {{model: {tiny_model(tmp_path)}, engine: {TINY_ENGINE}}}\n"
    config = gateway_config(tmp_path, models, "api_keys: [k]\n")
    proc, base = start_gateway(
        config, "--header-timeout", "4", "--body-timeout", "4", preexec=nofile(LIMIT)
    )
    port = int(base.rsplit(":", 1)[1])
    conns = []
    try:
        conns = half_sent(port, ATTACKERS)
        body = {"model": "a", "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}
        r = httpx.post(f"{base}/v1/completions", json=body, headers=KEY, timeout=180)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        assert httpx.get(f"{base}/health").json()["models"] == {"a": "warm"}
        displaced = [answer_of(c, 0.5) for c in conns[:50]]  # the oldest went first
        assert all(a.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in a for a in displaced)
        late = [answer_of(c, 10) for c in conns[-20:]]  # kept, then timed out
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in late), late[:2]
        # a body that never comes: 408 once --body-timeout has passed
        slow = half_sent(port, 1, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
                         b"Bearer k\r\nContent-Length: 100\r\n\r\n{")[0]  # fmt: skip
        assert answer_of(slow, 10).startswith(b"HTTP/1.1 408 ")
        assert httpx.post(f"{base}/v1/completions", json=body, headers=KEY).status_code == 200
    finally:
        for c in conns:
            c.close()
        out = stop(proc)
    assert "Too many open files" not in out and "serving at most" in out
