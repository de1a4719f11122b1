"""The worker's OpenAI API routes: completions and chat completions (with SSE streaming), models,
health and Prometheus metrics. Handlers read what they serve from `request.app.state`
(medusa.serve.api_server); the serving logic is ServingCompletion's and ServingChat's."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest

from medusa.serve.protocol import ChatRequest, CompletionRequest, parse, read_json

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    engine = request.app.state.engine
    if engine.error:
        return JSONResponse({"status": "failed", "error": engine.error}, status_code=500)
    if not engine.ready.is_set():
        return JSONResponse({"status": "starting", "stage": engine.stage}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    name = request.app.state.served_name
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "medusa"}],
    }


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    state = request.app.state
    engine, metrics = state.engine, state.metrics
    metrics.queue.set(engine.num_pending)
    if engine.engine is not None:
        for ran, steps in engine.engine.prefill_steps.items():
            metrics.prefill_steps.labels(ran).set(steps)
        for stage, secs in engine.engine.timings.items():
            metrics.startup.labels(stage).set(secs)
        kv = engine.engine.kv_size
        if kv is not None:
            metrics.kv_blocks.labels(kv.source).set(kv.num_blocks)
            metrics.kv_bytes.labels(kv.source).set(kv.nbytes)
    return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state = request.app.state
    req = parse(CompletionRequest, await read_json(request, state.max_body_bytes))
    return await state.completion.create(req)


@router.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    state = request.app.state
    req = parse(ChatRequest, await read_json(request, state.max_body_bytes))
    return await state.chat.create(req)
