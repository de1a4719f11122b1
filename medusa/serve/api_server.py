"""The worker's OpenAI-compatible API server over one engine: the app, and what its routes read
from `app.state` (the engine, the served name, the metrics, the serving objects).

    medusa.serve.api_routes       the routes          medusa.serve.protocol   request models
    medusa.serve.serving*         the serving logic   medusa.serve.weaving_routes  /weaving"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from medusa import env
from medusa.serve.api_routes import router
from medusa.serve.async_engine import AsyncEngine
from medusa.serve.protocol import ERROR_HANDLERS, MAX_BODY_BYTES, NO_DOCS, validation_error
from medusa.serve.server_metrics import ServerMetrics
from medusa.serve.serving_chat import ServingChat
from medusa.serve.serving_completion import ServingCompletion
from medusa.serve.weaving_routes import include_weaving
from medusa.serve.worker_auth import TokenGuard


def create_app(
    engine: AsyncEngine,
    served_name: str,
    *,
    max_pending: int = 256,
    max_body_bytes: int = MAX_BODY_BYTES,
    token: str | None = None,
    weaving_dir: str | None = None,
) -> FastAPI:
    """`token` (default: MEDUSA_WORKER_TOKEN): when set, requests without it get 401.
    `weaving_dir` (default: MEDUSA_WEAVING_DIR): with a token, the /weaving routes make and open
    exchange regions there; without either they are off."""
    handlers = {**ERROR_HANDLERS, RequestValidationError: validation_error}
    app = FastAPI(title="medusa worker", exception_handlers=handlers, **NO_DOCS)
    state = app.state
    state.engine, state.served_name, state.max_body_bytes = engine, served_name, max_body_bytes
    state.metrics = metrics = ServerMetrics()
    state.completion = ServingCompletion(engine, served_name, metrics, max_pending)
    state.chat = ServingChat(engine, served_name, metrics, max_pending)
    token = env.WORKER_TOKEN.get() if token is None else token
    if token:
        app.add_middleware(TokenGuard, token=token)
    app.include_router(router)
    where = env.WEAVING_DIR.get() if weaving_dir is None else weaving_dir
    include_weaving(app, token, where)
    return app
