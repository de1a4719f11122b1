"""The gateway's HTTP side: OpenAI routes forwarded to workers (SSE passed through), the catalog,
health, metrics, optional bearer keys."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import FrameType
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException

from medusa.serve.gateway.admission import prompt_tokens
from medusa.serve.gateway.backends import WorkerBackend
from medusa.serve.gateway.backends.local import LocalBackend
from medusa.serve.gateway.config import GatewayConfig
from medusa.serve.gateway.forwarding import (
    Forwarding,
    Relayed,
    end_stream,
    request_body,
    sse_error,
)
from medusa.serve.gateway.hop import HopResponse
from medusa.serve.gateway.instance import Lease
from medusa.serve.gateway.instances import Instance, InstanceManager, QueueFull, Unavailable
from medusa.serve.gateway.metrics import GatewayMetrics
from medusa.serve.gateway.sharing import Sharing
from medusa.serve.gateway.slices import Slice
from medusa.serve.protocol import (
    MAX_BODY_BYTES,
    NO_DOCS,
    APIError,
    read_body,
    server_error,
)

log = logging.getLogger("medusa.gateway")


def _error(
    status: int,
    message: str,
    kind: str,
    headers: dict[str, str] | None = None,
    *,
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    return APIError(status, message, kind=kind, headers=headers, param=param, code=code).response()


@contextlib.contextmanager
def _on_terminate(begin: Callable[[], None]) -> Iterator[None]:
    """Runs `begin` (on the loop) at SIGTERM/SIGINT, before the server's own handler: uvicorn
    waits for open requests before shutting the app down, and queued ones would wait forever."""
    loop = asyncio.get_running_loop()
    if threading.current_thread() is not threading.main_thread():
        yield  # not run by a server that handles signals (a test client)
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handle(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(begin)
        prev = previous[signal.Signals(sig)]
        if callable(prev):
            prev(sig, frame)

    for sig in previous:
        if callable(previous[sig]):  # NOTE: only chain a handler the server installed
            signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, prev in previous.items():
            if callable(prev):
                signal.signal(sig, prev)


def create_gateway(
    config: GatewayConfig,
    slices: list[Slice],
    *,
    wait_timeout: float = 300.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    backend: WorkerBackend | None = None,
) -> Forwarding:
    metrics = GatewayMetrics()
    backend = backend or LocalBackend()

    async def on_cold_start(inst: Instance) -> None:
        metrics.cold_starts.labels(inst.model).inc()
        metrics.cold_seconds.labels(inst.model).observe(inst.ready_seconds)
        for stage, secs in inst.stages.items():
            metrics.pooled_stage_seconds.labels(inst.model, stage).observe(secs)
        for stage, secs in inst.timings.items():
            metrics.stage_seconds.labels(inst.model, stage).set(secs)
        if inst.timings:
            return
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = await inst.client.get("/metrics", timeout=5)
            text = r.text
            for line in text.splitlines():
                if line.startswith('medusa_startup_seconds{stage="'):
                    stage = line.split('"')[1]
                    metrics.stage_seconds.labels(inst.model, stage).set(float(line.split()[-1]))

    manager = InstanceManager(
        config.models,
        slices,
        on_cold_start=on_cold_start,
        pool_size=config.pool_size,
        sharing=Sharing(config, slices, open_ledger=backend.open_ledger),
        backend=backend,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        kinds = sorted({s.kind for s in slices})
        if manager.pool.enabled:
            sizes = ", ".join(f"{k}: {config.pool_size(k)}" for k in kinds)
            log.info("warm pool: pooled workers per slice class: %s", sizes)
        task = asyncio.get_running_loop().create_task(manager.autoscale())
        with _on_terminate(manager.begin_shutdown):
            yield
        task.cancel()
        log.info("draining: waiting for in-flight requests, then stopping workers")
        await manager.shutdown()

    app = FastAPI(title="medusa gateway", lifespan=lifespan, **NO_DOCS)
    app.state.manager = manager
    app.add_exception_handler(Exception, server_error)

    def authorized(request: Request) -> bool:
        if not config.api_keys:
            return True
        auth = request.headers.get("authorization", "")
        sent = auth[7:].encode() if auth.startswith("Bearer ") else b""
        # NOTE: constant-time, every key compared: how long a refusal takes says nothing.
        return (
            sent != b"" and sum(hmac.compare_digest(sent, k.encode()) for k in config.api_keys) > 0
        )

    def unauthorized() -> JSONResponse:
        return _error(
            401,
            "a valid API key is required (Authorization: Bearer ...)",
            "auth_error",
            code="invalid_api_key",
        )

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail), "invalid_request_error", dict(e.headers or {}))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": {m: manager.state(m) for m in config.models}}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        return JSONResponse({"object": "list", "data": [entry(m) for m in config.models]})

    def entry(m: str) -> dict[str, Any]:
        out = {
            "id": m,
            "object": "model",
            "created": 0,
            "owned_by": "medusa",
            "state": manager.state(m),
            "instances": len([i for i in manager.instances[m] if i.state.value != "dead"]),
        }
        failure = manager.policy.failure(m)
        if failure is not None:
            out.update(error=failure.reason, retry_after=failure.retry_after)
        return out

    @app.get("/metrics")
    async def prometheus() -> Response:
        for m in config.models:
            metrics.queue.labels(m).set(manager.waiting[m])
            if config.models[m].engine.get("weights") == "host":
                metrics.host_weight_bytes.labels(m).set(manager.host_weights.nbytes(m))
            for state in ("starting", "warm", "draining"):
                n = len([i for i in manager.instances[m] if i.state.value == state])
                metrics.instances.labels(m, state).set(n)
        manager.sharing.report(metrics, manager.live())
        for kind in {s.kind for s in slices}:
            for state, idle in (("warming", False), ("idle", True)):
                metrics.pool_workers.labels(kind, state).set(
                    manager.pool.num_workers(kind, idle=idle)
                )
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/admin/instances")
    async def instances(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        return JSONResponse(
            {
                m: [
                    {
                        "pid": i.proc.pid,
                        "address": f"unix:{i.proc.uds}" if i.proc.uds else f"{i.host}:{i.port}",
                        "slice": i.slice.id,
                        "node": i.proc.node,
                        "state": i.state.value,
                        "inflight": i.inflight,
                    }
                    for i in insts
                ]
                for m, insts in manager.instances.items()
            }
        )

    @app.get("/admin/pool")
    async def pool(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        return JSONResponse(
            [
                {
                    "pid": w.proc.pid,
                    "slice": w.slice.id,
                    "slice_class": w.slice.kind,
                    "state": "idle" if w.idle else "warming",
                }
                for w in manager.pool.workers
                if w.proc.poll() is None
            ]
        )

    async def forward(request: Request, route: str) -> Response:
        if not authorized(request):
            return unauthorized()
        raw = await read_body(request, max_body_bytes)
        body = request_body(raw)
        model = body.get("model")
        if model not in config.models:
            return _error(
                404,
                f"model {model!r} is not in the catalog; available: {sorted(config.models)}",
                "invalid_request_error",
                param="model",
                code="model_not_found",
            )
        stream, tokens = bool(body.get("stream")), prompt_tokens(body)
        for attempt in (0, 1):
            try:
                lease = await manager.acquire(model, wait_timeout)
            except QueueFull:
                metrics.requests.labels(model, "429").inc()
                return _error(
                    429,
                    f"{model}: the queue is full ({config.models[model].max_queue} "
                    "waiting); retry later",
                    "rate_limit_error",
                    {"Retry-After": "2"},
                    code="queue_full",
                )
            except Unavailable as e:
                metrics.requests.labels(model, "503").inc()
                headers = {"Retry-After": str(e.retry_after)}
                return _error(503, str(e), "unavailable", headers, code=e.code)
            answer = await send(lease, route, raw, stream, tokens)
            if answer is not None:
                return answer
            if attempt == 0:
                log.warning("retrying a %s request on another instance", model)
        metrics.requests.labels(model, "503").inc()
        return _error(
            503,
            f"{model}: the worker died and no other instance answered",
            "unavailable",
            {"Retry-After": "5"},
        )

    async def send(
        lease: Lease, route: str, raw: bytes, stream: bool, tokens: int
    ) -> Response | None:
        """The worker's answer, or None if it is gone (its instance is retired). The lease is
        released here on every path, or by the relayed stream once it ends."""
        inst, handed = lease.inst, False
        try:
            await lease.admit(tokens)  # elastic slices: its turn
            t0 = time.perf_counter()
            try:
                resp = await inst.proc.hop.post(route, raw)
                content = None if stream else await resp.read()
            except httpx.TransportError as e:  # NotOurWorker too: never relayed
                log.warning("%s on %s: %s", inst.model, inst.slice.id, e)
                manager.mark_dead(inst)
                return None
            if content is not None:
                metrics.ttft.labels(inst.model).observe(time.perf_counter() - t0)
                metrics.requests.labels(inst.model, str(resp.status_code)).inc()
                media = resp.headers.get("content-type")
                return Response(content, status_code=resp.status_code, media_type=media)
            handed = True
            return Relayed(
                relay(resp, inst, t0),
                lambda: end_stream(resp, lease),
                status_code=resp.status_code,
                media_type=resp.headers.get("content-type", "text/event-stream"),
            )
        finally:
            if not handed:
                lease.release()

    async def relay(resp: HopResponse, inst: Instance, t0: float) -> AsyncIterator[bytes]:
        model, last, pending = inst.model, None, b""
        try:
            async for chunk in resp.pieces():
                now = time.perf_counter()
                if last is None:
                    metrics.ttft.labels(model).observe(now - t0)
                else:
                    metrics.tpot.labels(model).observe(now - last)
                last = now
                # Whole events only: an event cut by a dying worker must not reach the client.
                pending += chunk
                end = pending.rfind(b"\n\n") + 2
                if end > 1:
                    yield pending[:end]
                    pending = pending[end:]
            if pending:
                yield pending
            metrics.requests.labels(model, str(resp.status_code)).inc()
        except httpx.TransportError:
            manager.mark_dead(inst)
            metrics.requests.labels(model, "502").inc()
            yield sse_error(f"{model}: the worker stopped in the middle of the answer; retry")

    return Forwarding(app, forward)  # /v1/completions and /v1/chat/completions
