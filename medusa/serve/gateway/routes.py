"""The gateway's own routes: health, the catalog, Prometheus metrics and the admin views. Handlers
read the gateway from `request.app.state` (medusa.serve.gateway.app); the forwarded routes are the
proxy's (medusa.serve.gateway.proxy)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest

from medusa.serve.gateway.instances import InstanceManager

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    manager: InstanceManager = request.app.state.manager
    return {"status": "ok", "models": {m: manager.state(m) for m in manager.models}}


@router.get("/v1/models")
async def models(request: Request) -> Response:
    state = request.app.state
    if not state.api_keys.allow(request):
        return state.api_keys.refusal()
    data = [_entry(state.manager, m) for m in state.manager.models]
    return JSONResponse({"object": "list", "data": data})


def _entry(manager: InstanceManager, m: str) -> dict[str, Any]:
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


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    manager: InstanceManager = request.app.state.manager
    metrics = request.app.state.metrics
    for m, cfg in manager.models.items():
        metrics.queue.labels(m).set(manager.waiting[m])
        if cfg.engine.get("weights") == "host":
            metrics.host_weight_bytes.labels(m).set(manager.host_weights.nbytes(m))
        for state in ("starting", "warm", "draining"):
            n = len([i for i in manager.instances[m] if i.state.value == state])
            metrics.instances.labels(m, state).set(n)
    manager.sharing.report(metrics, manager.live())
    for kind in {s.kind for s in manager.slices}:
        for state, idle in (("warming", False), ("idle", True)):
            metrics.pool_workers.labels(kind, state).set(manager.pool.num_workers(kind, idle=idle))
    return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")


@router.get("/admin/instances")
async def instances(request: Request) -> Response:
    state = request.app.state
    if not state.api_keys.allow(request):
        return state.api_keys.refusal()
    manager: InstanceManager = state.manager
    return JSONResponse(
        {
            m: [
                {
                    "pid": i.proc.pid,
                    "address": f"unix:{i.proc.uds}" if i.proc.uds else f"{i.host}:{i.port}",
                    "slice": i.slice.id,
                    "slices": [s.id for s in i.slice.held],  # a tensor-parallel worker's: n
                    "node": i.proc.node,
                    "state": i.state.value,
                    "inflight": i.inflight,
                }
                for i in insts
            ]
            for m, insts in manager.instances.items()
        }
    )


@router.get("/admin/pool")
async def pool(request: Request) -> Response:
    state = request.app.state
    if not state.api_keys.allow(request):
        return state.api_keys.refusal()
    workers = state.manager.pool.workers
    return JSONResponse(
        [
            {
                "pid": w.proc.pid,
                "slice": w.slice.id,
                "slice_class": w.slice.kind,
                "state": "idle" if w.idle else "warming",
            }
            for w in workers
            if w.proc.poll() is None
        ]
    )
