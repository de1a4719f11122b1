"""The gateway's HTTP side: OpenAI routes forwarded to workers (SSE passed through), the catalog,
health, metrics, optional bearer keys."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from medusa.serve.gateway.config import GatewayConfig
from medusa.serve.gateway.instances import Instance, InstanceManager, NoCapacity, QueueFull
from medusa.serve.gateway.slices import Slice

log = logging.getLogger("medusa.gateway")
JSON = {"content-type": "application/json"}


def _error(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": None}},
        status_code=status,
        headers=headers,
    )


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.cold_starts = Counter(
            "medusa_gateway_cold_starts", "workers started", ["model"], registry=r
        )
        self.cold_seconds = Histogram(
            "medusa_gateway_cold_start_seconds",
            "process start to ready",
            ["model"],
            registry=r,
            buckets=(0.5, 1, 2, 4, 8, 16, 32, 64),
        )
        self.stage_seconds = Gauge(
            "medusa_gateway_cold_start_stage_seconds",
            "the last cold start's seconds by stage",
            ["model", "stage"],
            registry=r,
        )
        self.queue = Gauge(
            "medusa_gateway_queue_length", "requests waiting for an instance", ["model"], registry=r
        )
        self.instances = Gauge(
            "medusa_gateway_instances", "instances by state", ["model", "state"], registry=r
        )
        self.ttft = Histogram(
            "medusa_gateway_ttft_seconds",
            "time to first byte from the worker",
            ["model"],
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
        )
        self.tpot = Histogram(
            "medusa_gateway_tpot_seconds",
            "time between streamed chunks",
            ["model"],
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
        )
        self.requests = Counter(
            "medusa_gateway_requests", "requests by outcome", ["model", "status"], registry=r
        )


def create_gateway(
    config: GatewayConfig, slices: list[Slice], *, wait_timeout: float = 300.0
) -> FastAPI:
    metrics = GatewayMetrics()
    client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0))

    async def on_cold_start(inst: Instance) -> None:
        metrics.cold_starts.labels(inst.model).inc()
        metrics.cold_seconds.labels(inst.model).observe(inst.ready_seconds)
        with contextlib.suppress(httpx.HTTPError, ValueError):
            text = (await client.get(f"{inst.url}/metrics", timeout=5)).text
            for line in text.splitlines():
                if line.startswith('medusa_startup_seconds{stage="'):
                    stage = line.split('"')[1]
                    metrics.stage_seconds.labels(inst.model, stage).set(float(line.split()[-1]))

    manager = InstanceManager(config.models, slices, on_cold_start=on_cold_start)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(manager.autoscale())
        yield
        task.cancel()
        log.info("draining: waiting for in-flight requests, then stopping workers")
        await manager.shutdown()
        await client.aclose()

    app = FastAPI(title="medusa gateway", lifespan=lifespan)
    app.state.manager = manager

    def authorized(request: Request) -> bool:
        if not config.api_keys:
            return True
        auth = request.headers.get("authorization", "")
        return auth.startswith("Bearer ") and auth[7:] in config.api_keys

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": {m: manager.state(m) for m in config.models}}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        if not authorized(request):
            return _error(
                401, "a valid API key is required (Authorization: Bearer ...)", "auth_error"
            )
        data = [
            {
                "id": m,
                "object": "model",
                "created": 0,
                "owned_by": "medusa",
                "state": manager.state(m),
                "instances": len([i for i in manager.instances[m] if i.state.value != "dead"]),
            }
            for m in config.models
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/metrics")
    async def prometheus() -> Response:
        for m in config.models:
            metrics.queue.labels(m).set(manager.waiting[m])
            for state in ("starting", "warm", "draining"):
                n = len([i for i in manager.instances[m] if i.state.value == state])
                metrics.instances.labels(m, state).set(n)
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/admin/instances")
    async def instances() -> dict[str, Any]:
        return {
            m: [
                {
                    "pid": i.proc.pid,
                    "port": i.port,
                    "slice": i.slice.id,
                    "state": i.state.value,
                    "inflight": i.inflight,
                }
                for i in insts
            ]
            for m, insts in manager.instances.items()
        }

    async def forward(request: Request, route: str) -> Response:
        if not authorized(request):
            return _error(
                401, "a valid API key is required (Authorization: Bearer ...)", "auth_error"
            )
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "the request body is not valid JSON", "invalid_request_error")
        model = body.get("model") if isinstance(body, dict) else None
        if model not in config.models:
            return _error(
                404,
                f"model {model!r} is not in the catalog; available: {sorted(config.models)}",
                "invalid_request_error",
            )
        stream = bool(body.get("stream"))
        for attempt in (0, 1):
            try:
                inst = await manager.acquire(model, wait_timeout)
            except QueueFull:
                metrics.requests.labels(model, "429").inc()
                return _error(
                    429,
                    f"{model}: the queue is full ({config.models[model].max_queue} "
                    "waiting); retry later",
                    "rate_limit_error",
                    {"Retry-After": "2"},
                )
            except NoCapacity as e:
                metrics.requests.labels(model, "503").inc()
                return _error(503, str(e), "unavailable", {"Retry-After": "5"})
            t0 = time.perf_counter()
            try:
                req = client.build_request("POST", f"{inst.url}{route}", content=raw, headers=JSON)
                resp = await client.send(req, stream=stream)
            except httpx.TransportError:
                manager.release(inst)
                manager.mark_dead(inst)
                if attempt == 0:
                    log.warning("retrying a %s request on another instance", model)
                    continue
                metrics.requests.labels(model, "503").inc()
                return _error(
                    503,
                    f"{model}: the worker died and no other instance answered",
                    "unavailable",
                    {"Retry-After": "5"},
                )
            if not stream:
                content = resp.content  # read in full by send() when not streaming
                manager.release(inst)
                metrics.ttft.labels(model).observe(time.perf_counter() - t0)
                metrics.requests.labels(model, str(resp.status_code)).inc()
                return Response(
                    content,
                    status_code=resp.status_code,
                    media_type=resp.headers.get("content-type"),
                )
            return StreamingResponse(
                relay(resp, inst, model, t0),
                status_code=resp.status_code,
                media_type="text/event-stream",
            )
        return _error(503, f"{model}: unavailable", "unavailable")

    async def relay(
        resp: httpx.Response, inst: Instance, model: str, t0: float
    ) -> AsyncIterator[bytes]:
        last = None
        try:
            async for chunk in resp.aiter_raw():
                now = time.perf_counter()
                if last is None:
                    metrics.ttft.labels(model).observe(now - t0)
                else:
                    metrics.tpot.labels(model).observe(now - last)
                last = now
                yield chunk
            metrics.requests.labels(model, str(resp.status_code)).inc()
        except httpx.TransportError:
            manager.mark_dead(inst)
        finally:
            await resp.aclose()
            manager.release(inst)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward(request, "/v1/chat/completions")

    return app
