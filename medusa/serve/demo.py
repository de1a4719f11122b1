"""`medusa run --demo`: serve, answer one chat request over HTTP, print it, stop."""

from __future__ import annotations

import sys
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI

from medusa.serve.async_engine import AsyncEngine


def run_demo(
    app: FastAPI, engine: AsyncEngine, host: str, port: int, model: str, prompt: str
) -> int:
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://{host}:{port}"
    try:
        if not _wait_ready(base, engine):
            return 1
        body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                "temperature": 0, "max_tokens": 64}  # fmt: skip
        t1 = time.perf_counter()
        r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
        answer = r.json()
        if r.status_code != 200:
            print(f"medusa run: request failed ({r.status_code}): {answer}", file=sys.stderr)
            return 1
        assert engine.engine is not None
        stages = ", ".join(
            f"{k} {v:.2f}s" for k, v in engine.engine.timings.items() if k != "total"
        )
        print(f"serving {model} on {base} ({engine.engine.device.kind} back-end)")
        # NOTE: the engine's own start-up, not the wait here: with --require-artifact the engine
        # was ready before the server started.
        print(f"ready in {engine.engine.timings['total']:.2f} s: {stages}")
        print(f"POST /v1/chat/completions  user: {prompt}")
        print(f"assistant: {answer['choices'][0]['message']['content']}")
        print(
            f"({answer['usage']['completion_tokens']} tokens in {time.perf_counter() - t1:.2f} s)"
        )
        return 0
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _wait_ready(base: str, engine: AsyncEngine) -> bool:
    """Polls /health until the engine serves (True) or failed to start (False, said why)."""
    while True:
        try:
            health = httpx.get(f"{base}/health", timeout=5)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if health.status_code == 200:
            return True
        if health.status_code == 500:
            print(f"medusa run: the engine failed to start: {engine.error}", file=sys.stderr)
            return False
        time.sleep(0.2)
