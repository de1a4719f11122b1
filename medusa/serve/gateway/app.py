"""The gateway's HTTP side: the app, and the gateway its routes read from `app.state` (the config,
the instance manager, the metrics, the API keys, the proxy).

    medusa.serve.gateway.routes     health, the catalog, metrics, the admin views
    medusa.serve.gateway.proxy      /v1/completions and /v1/chat/completions, forwarded to
                                    workers (SSE passed through), past FastAPI's routing
                                    (medusa.serve.gateway.forwarding)
    medusa.serve.gateway.instances  the workers: started, routed to, scaled, stopped"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from types import FrameType

from fastapi import FastAPI

from medusa.serve.gateway.api_keys import ApiKeys
from medusa.serve.gateway.backends import WorkerBackend
from medusa.serve.gateway.backends.local import LocalBackend
from medusa.serve.gateway.config import GatewayConfig
from medusa.serve.gateway.forwarding import Forwarding
from medusa.serve.gateway.instances import InstanceManager
from medusa.serve.gateway.metrics import GatewayMetrics
from medusa.serve.gateway.proxy import Proxy
from medusa.serve.gateway.routes import router
from medusa.serve.gateway.sharing import Sharing
from medusa.serve.gateway.slices import Slice
from medusa.serve.protocol import ERROR_HANDLERS, MAX_BODY_BYTES, NO_DOCS

log = logging.getLogger("medusa.gateway")


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


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    manager: InstanceManager = app.state.manager
    if manager.pool.enabled:
        kinds = sorted({s.kind for s in manager.slices})
        sizes = ", ".join(f"{k}: {app.state.config.pool_size(k)}" for k in kinds)
        log.info("warm pool: pooled workers per slice class: %s", sizes)
    task = asyncio.get_running_loop().create_task(manager.autoscale())
    with _on_terminate(manager.begin_shutdown):
        yield
    task.cancel()
    log.info("draining: waiting for in-flight requests, then stopping workers")
    await manager.shutdown()


def create_gateway(
    config: GatewayConfig,
    slices: list[Slice],
    *,
    wait_timeout: float = 300.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    backend: WorkerBackend | None = None,
) -> Forwarding:
    backend = backend or LocalBackend()
    metrics = GatewayMetrics()
    manager = InstanceManager(
        config.models,
        slices,
        on_cold_start=metrics.observe_cold_start,
        pool_size=config.pool_size,
        sharing=Sharing(config, slices, open_ledger=backend.open_ledger),
        backend=backend,
    )
    app = FastAPI(
        title="medusa gateway", lifespan=lifespan, exception_handlers=ERROR_HANDLERS, **NO_DOCS
    )
    state = app.state
    state.config, state.manager, state.metrics = config, manager, metrics
    state.api_keys = api_keys = ApiKeys(config.api_keys)
    state.proxy = Proxy(
        config,
        manager,
        metrics,
        api_keys,
        wait_timeout=wait_timeout,
        max_body_bytes=max_body_bytes,
    )
    app.include_router(router)
    return Forwarding(app)  # /v1/completions and /v1/chat/completions: state.proxy
