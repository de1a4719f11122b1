"""What the gateway's forwarding of a request needs beside its routes: the body it reads (and
refuses early), and the response that relays a worker's stream and gives the request's slot back
however the stream ends."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from medusa.serve.gateway.hop import HopResponse
from medusa.serve.gateway.instance import Lease
from medusa.serve.protocol import APIError, error_body, loads, refuse_lone_surrogates

log = logging.getLogger("medusa.gateway")


def request_body(raw: bytes) -> dict[str, Any]:
    """The body of a request to forward, as far as the gateway reads it; an OpenAI-shaped 400
    for what the worker would refuse anyway and the gateway cannot route (not a JSON object, a
    model that is not a string, text that is not Unicode)."""
    body = loads(raw)
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(body).__name__}")
    if not isinstance(body.get("model"), str):
        raise APIError(400, "model: the name of a model in the catalog (a string)", param="model")
    if b"\\ud" in raw or b"\\uD" in raw:  # NOTE: only a \u escape can make a lone surrogate
        refuse_lone_surrogates(body)
    return body


class Relayed(StreamingResponse):
    """A worker's streamed answer: `on_end` runs once the response is over, however it ended
    (a client that left, a worker that died) — where the lease goes back."""

    def __init__(
        self, content: AsyncIterator[bytes], on_end: Callable[[], Awaitable[None]], **kw: Any
    ) -> None:
        super().__init__(content, **kw)
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_end()


async def end_stream(resp: HopResponse, lease: Lease) -> None:
    try:
        resp.close()
    finally:
        lease.release()


def sse_error(message: str) -> bytes:
    """An OpenAI-shaped error event: the openai client raises it instead of ending normally."""
    body = error_body(message, "server_error", code="worker_died")
    return f"data: {json.dumps(body)}\n\n".encode()


class Forwarding:
    """ASGI: requests to the forwarded routes go straight to the app's proxy (`app.state.proxy`,
    medusa.serve.gateway.proxy), past FastAPI's routing and middleware (which cost the gateway
    more per request than forwarding it); the rest, and the lifespan, to `app`."""

    ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})

    def __init__(self, app: FastAPI) -> None:
        self.app, self.forward = app, app.state.proxy.forward

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.ROUTES:
            await self.app(scope, receive, send)
            return
        try:
            if scope["method"] != "POST":
                raise APIError(405, f"{scope['path']} takes POST", headers={"Allow": "POST"})
            response = await self.forward(Request(scope, receive), scope["path"])
        except APIError as e:
            response = e.response()
        except Exception:  # noqa: BLE001 - the server's last resort: logged, answered OpenAI-shaped
            log.exception("forwarding %s failed", scope["path"])
            response = APIError(
                500, "internal error; see the server's log", kind="server_error"
            ).response()
        await response(scope, receive, send)
