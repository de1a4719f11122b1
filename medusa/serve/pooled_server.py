"""`medusa run --pool`: a worker of the gateway's warm pool. It does what every start does before it
knows its model (imports, the device's runtime and kernels, the HTTP server, opening the catalog's
model files and tokenizers: medusa.serve.prepared), then waits for the gateway to assign a model on
a route only the gateway can call (the per-worker token), restores it and serves it. It serves one
model and exits with it: a second restore in one process would diverge from the recorded
start-up."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from medusa import env, scratch
from medusa.engine.config import EngineConfig
from medusa.serve.api_server import create_app
from medusa.serve.async_engine import AsyncEngine, StageFn
from medusa.serve.connections import ConnectionLimits, make_server
from medusa.serve.prepared import Assignment, PreparedArtifact, PreparedSource
from medusa.serve.protocol import NO_DOCS, APIError, api_error, read_json
from medusa.serve.worker_auth import TokenGuard

if TYPE_CHECKING:
    import uvicorn

    from medusa.artifact import Artifact
    from medusa.engine.device import Device
    from medusa.engine.llm_engine import LLMEngine
    from medusa.serve.listeners import Listener
    from medusa.weights import WeightStore

# Seconds after a start before the other models' prepared stores are closed: after its first
# request, which they would slow (an unmap holds the process's memory map).
RELEASE_AFTER = 1.0
COPY_CHECK = 1.0

log = logging.getLogger("medusa.pool")

router = APIRouter()  # the pool's routes, over app.state.pooled


@router.get("/health")
async def health() -> JSONResponse:
    return JSONResponse({"status": "pooled"}, status_code=503)


@router.get("/pool")
async def pool(request: Request) -> JSONResponse:
    pooled = request.app.state.pooled
    if pooled.error:
        return JSONResponse({"state": "failed", "error": pooled.error}, status_code=500)
    engine = pooled.engine
    if engine is not None and not engine.ready.is_set():  # assigned: its start-up stage
        return JSONResponse({"state": "starting", "stage": engine.stage}, status_code=503)
    state = "idle" if pooled.prepared.is_set() else "warming"
    return JSONResponse({"state": state}, status_code=200 if state == "idle" else 503)


@router.post("/pool/assign")
async def assign(request: Request) -> JSONResponse:
    pooled = request.app.state.pooled
    return await pooled.assign(await read_json(request, pooled.max_body_bytes))


class PooledServer:
    """The ASGI app of a pooled worker: the pool's routes until a model is assigned, then the
    API server (medusa.serve.api_server) over that model's engine."""

    def __init__(
        self,
        command: click.Command,
        prepare: list[str],
        max_body_bytes: int,
        prepare_artifacts: list[str] | None = None,
    ) -> None:
        self.command, self.prepare, self.max_body_bytes = command, prepare, max_body_bytes
        self.prepare_artifacts = prepare_artifacts or []
        self.artifacts: dict[str, PreparedArtifact] = {}
        self.device: Device | None = None
        self.sources: dict[str, PreparedSource] = {}
        self.error: str | None = None
        self.prepared = threading.Event()
        self.engine: AsyncEngine | None = None
        self.server: uvicorn.Server | None = None
        self._assigned = False
        self._prepared_lock = threading.Lock()  # the artifacts: the copy watch, the assignment
        handlers: dict[Any, Any] = {APIError: api_error}
        app = FastAPI(title="medusa pooled worker", exception_handlers=handlers, **NO_DOCS)
        app.state.pooled = self
        app.include_router(router)
        self.inner: Any = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.inner(scope, receive, send)

    def warm_up(self) -> None:
        """Everything a start does before it knows its model (on a thread: the server listens
        meanwhile, so the gateway sees the worker come up)."""
        from medusa.engine.device import Device
        from medusa.engine.llm_engine import LLMEngine  # noqa: F401 - its imports, done now
        from medusa.engine.loader import ModelError, locate_model, open_model

        t0 = time.perf_counter()
        try:
            self.device = Device()
        except Exception as e:  # noqa: BLE001 - reported to the gateway, which replaces us
            self.error = f"{type(e).__name__}: {e}"
            log.error("pooled worker: warm-up failed: %s", self.error)
        # The first app costs ~25 ms (FastAPI and pydantic build their models), later ones ~2 ms.
        create_app(
            AsyncEngine(EngineConfig()), "warm-up", max_body_bytes=self.max_body_bytes, token=""
        )
        for model in self.prepare if self.error is None else []:
            try:
                self.sources[str(locate_model(model))] = PreparedSource(open_model(model))
            except (ModelError, OSError, ValueError) as e:
                # NOTE: not fatal: a start of that model opens it itself and reports the error.
                log.warning("pooled worker: cannot open %s ahead: %s", model, e)
        copies = _checked_copies()
        for d in self.prepare_artifacts if self.error is None else []:
            try:
                where = Path(d).resolve()
                self.artifacts[str(where)] = PreparedArtifact(where, copies.get(str(where)))
            except Exception as e:  # noqa: BLE001 - its start loads it itself and says why
                log.warning("pooled worker: cannot prepare the artifact %s: %s", d, e)
        log.info("pooled worker: warm in %.2f s", time.perf_counter() - t0)
        self.prepared.set()
        if any(a.copy is not None for a in self.artifacts.values()):
            threading.Thread(
                target=self._watch_copies, name="medusa-pool-copies", daemon=True
            ).start()

    def _watch_copies(self) -> None:
        """While idle: each mapped copy of a gateway's store is unmapped once the gateway frees
        it (checked every COPY_CHECK seconds)."""
        while True:
            time.sleep(COPY_CHECK)
            with self._prepared_lock:
                if self._assigned:
                    return
                for prep in self.artifacts.values():
                    prep.drop_copy_if_freed()

    async def assign(self, body: Any) -> JSONResponse:
        """POST /pool/assign {argv: [medusa run arguments], store_checked}: once."""
        if self._assigned:
            raise APIError(409, "this pooled worker has a model already", code="assigned")
        self._assigned = True
        argv = body.get("argv") if isinstance(body, dict) else None
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise APIError(400, "send {'argv': [medusa run arguments]}", param="argv")
        checked = body.get("store_checked", "")
        if not isinstance(checked, str):
            raise APIError(
                400,
                "store_checked is the gateway's descriptor of a checked store (a string)",
                param="store_checked",
            )
        return await self._assign(argv, checked)

    async def _assign(self, argv: list[str], store_checked: str) -> JSONResponse:
        t0 = time.perf_counter()
        if not self.prepared.is_set():
            await asyncio.to_thread(self.prepared.wait)
        try:
            if self.error:
                raise ValueError(f"the pooled worker's warm-up failed: {self.error}")
            job = Assignment(self.command, argv)
        except ValueError as e:
            return self._failed(str(e))
        engine = self.engine = AsyncEngine(
            job.config, lambda on_stage: self._build(job, store_checked, on_stage)
        )
        engine.start()
        # NOTE: built while the engine starts (5 ms of FastAPI routes; its routes answer 503
        # until the engine is ready, and nobody reaches them before self.inner is set).
        # NOTE: no guard of its own (token=""): the pooled worker's guard is in front of it, and
        # a second would prove the answer twice.
        app = create_app(engine, job.served_name, max_body_bytes=self.max_body_bytes, token="")
        await asyncio.to_thread(engine.ready.wait)
        scratch.remove_restore_trace()  # NOTE: read by the start only
        if engine.error:
            return self._failed(engine.error)
        self.inner = app
        release = threading.Timer(RELEASE_AFTER, self._release)
        release.daemon = True
        release.start()
        assert engine.engine is not None
        timings = dict(engine.engine.timings)
        log.info("pooled worker: serving %s, ready in %.3f s", job.served_name, timings["total"])
        return JSONResponse(
            {
                "status": "ok",
                "seconds": time.perf_counter() - t0,
                "timings": timings,
                "restored": engine.engine.restored,
            }
        )

    def _build(self, job: Assignment, store_checked: str, on_stage: StageFn) -> LLMEngine:
        from medusa.engine.llm_engine import LLMEngine
        from medusa.engine.loader import locate_model

        source = self.sources.get(str(locate_model(job.model)))
        artifact: str | Artifact | None = job.artifact
        store: WeightStore | None = None
        with self._prepared_lock:  # NOTE: the copy watch ends (self._assigned is set)
            key = str(Path(job.artifact).resolve()) if job.artifact else None
            prep = self.artifacts.get(key) if key else None
        # NOTE: a worker serves one model: what was prepared for the rest (and a copy of this
        # one's store it was not given) is closed once it serves (_release), not now: unmapping
        # a mapped copy of SmolLM2's store took 16-29 ms (2-core VM)
        if prep is not None and job.trust is None and prep.unchanged(Path(job.artifact or "")):
            log.info("pooled worker: %s was checked and its store opened at warm-up", job.artifact)
            artifact, store = prep.artifact, prep.store_for(store_checked)
        return LLMEngine(
            job.config,
            source=source,  # type: ignore[arg-type]
            artifact=artifact,
            store=store,
            require_artifact=job.require,
            validate=job.validate,
            trust=job.trust,
            device=self.device,
            store_checked=store_checked,
            on_stage=on_stage,
        )

    def _release(self) -> None:
        """Closes what was prepared and not handed to the start (PreparedArtifact.store_for)."""
        others, self.artifacts = list(self.artifacts.values()), {}
        for other in others:
            other.close()

    def _failed(self, reason: str) -> JSONResponse:
        """The reason goes to the gateway and, as the last line, to stderr; then the worker exits
        (its device state after a failed start is not worth trusting)."""
        click.echo(f"medusa run: {reason}", err=True)
        if self.server is not None:
            self.server.should_exit = True
        return JSONResponse({"status": "failed", "error": reason}, status_code=500)

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


def _checked_copies() -> dict[str, int]:
    """MEDUSA_POOL_STORES_CHECKED: the gateway's checked store copies by artifact directory."""
    raw = env.POOL_STORES_CHECKED.get()
    try:
        copies = json.loads(raw) if raw else {}
    except ValueError:
        copies = None
    if not isinstance(copies, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in copies.items()
    ):
        log.warning("pooled worker: %s=%r is not used: not a JSON object of descriptor numbers",
                    env.POOL_STORES_CHECKED.name, raw)  # fmt: skip
        return {}
    return copies


def serve_pooled(
    command: click.Command,
    listener: Listener,
    limits: ConnectionLimits,
    token: str,
    prepare: list[str],
    max_body_bytes: int,
    prepare_artifacts: list[str] | None = None,
) -> None:
    """Runs a pooled worker on `listener` until it is stopped (SIGTERM) or its assignment
    fails."""
    worker = PooledServer(command, prepare, max_body_bytes, prepare_artifacts)
    app = TokenGuard(worker, token)
    server = worker.server = make_server(app, limits, log_level="warning", access_log=False)
    threading.Thread(target=worker.warm_up, name="medusa-pool-warm-up", daemon=True).start()
    try:
        server.run(sockets=[listener.socket])
    finally:
        listener.close()
        worker.shutdown()
    if worker.engine is not None and worker.engine.error:
        raise SystemExit(1)
