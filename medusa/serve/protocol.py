"""What the worker and the gateway share on the wire: OpenAI-shaped errors, the request-body
reader (size cap, JSON that Python accepts but JSON does not), and the worker-token guard.

The gateway never sends a worker its token: each request carries a fresh nonce and
HMAC(token, "request:" nonce) (WORKER_AUTH_HEADER), and the worker's answer carries
HMAC(token, "answer:" nonce) (WORKER_PROOF_HEADER), which the gateway checks before it relays a
byte of it. Whatever answers in a worker's place (a port taken by someone else) learns nothing
it can use, and its answers are refused."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from medusa.errors import MedusaError
from medusa.serve import MAX_BODY_BYTES

WORKER_TOKEN_HEADER = "x-medusa-worker-token"  # the token itself (an operator's own request)
WORKER_AUTH_HEADER = "x-medusa-worker-auth"  # "NONCE.HMAC": the gateway's requests
WORKER_PROOF_HEADER = "x-medusa-worker-proof"  # the worker's answer to NONCE
MAX_NONCE = 64  # bytes

# No /docs, /redoc or /openapi.json: they describe nothing a client needs, and answered anyone.
NO_DOCS: dict[str, Any] = {"docs_url": None, "redoc_url": None, "openapi_url": None}


def worker_mac(token: bytes, purpose: bytes, nonce: bytes) -> bytes:
    """HMAC-SHA256 of `purpose:nonce` under a worker's token, hex: "request" (the gateway
    proves it holds the token) or "answer" (the worker does)."""
    return hmac.new(token, purpose + b":" + nonce, hashlib.sha256).hexdigest().encode()


M = TypeVar("M", bound=BaseModel)


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class APIError(MedusaError):
    """Raised anywhere in a request; answered as an OpenAI error body with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind, self.headers = kind, headers

    def response(self) -> JSONResponse:
        body = error_body(self.message, self.kind, self.param, self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


async def server_error(_: Request, e: Exception) -> JSONResponse:
    """The answer to an error no handler expected: OpenAI-shaped, without the details (they go
    to the log, as the server logs every unhandled exception)."""
    return APIError(500, "internal error; see the server's log", kind="server_error").response()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; send a finite number")


async def read_body(request: Request, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The request's body; APIError 413 past `max_bytes` (checked before reading it all)."""
    too_big = APIError(
        413,
        f"the request body is larger than {max_bytes} bytes; send a shorter prompt",
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_big
    parts, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_big
            parts.append(chunk)
    except ClientDisconnect:  # gone, or cut off by --body-timeout: nobody reads the answer
        raise APIError(408, "the request body did not arrive in time", code="timeout") from None
    return b"".join(parts)


def loads(raw: bytes) -> Any:
    """JSON; APIError 400 that says where it stops being JSON (NaN and Infinity are not)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise APIError(
            400, f"the request body is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
        ) from None
    except ValueError as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise APIError(400, "the request body nests arrays or objects too deeply") from None


async def read_json(request: Request, max_bytes: int = MAX_BODY_BYTES) -> Any:
    return loads(await read_body(request, max_bytes))


def parse(model: type[M], body: Any) -> M:
    """`body` as `model`; APIError 400 naming the first field that does not fit."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(body).__name__}")
    refuse_lone_surrogates(body)
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = _param(body, first["loc"])
        raise APIError(400, f"{where}: {first['msg']}", param=where) from None


def refuse_lone_surrogates(body: Any) -> None:
    """APIError 400 naming the first string in a parsed body that is not Unicode text."""
    bad = _lone_surrogate(body, ())
    if bad is not None:
        where, char = ".".join(map(str, bad[0])), bad[1]
        raise APIError(
            400,
            f"{where}: holds a lone surrogate ({char}), which is not Unicode text; send UTF-8",
            param=where or None,
        )


def _param(body: Any, loc: tuple[int | str, ...]) -> str:
    """The field path of a pydantic error, without the tags it adds for union members."""
    path: list[str] = []
    for i, key in enumerate(loc):
        if isinstance(body, dict) and key in body:
            body = body[key]
            path.append(str(key))
        elif isinstance(body, list) and isinstance(key, int) and 0 <= key < len(body):
            body = body[key]
            path.append(str(key))
        else:
            if i == len(loc) - 1 and isinstance(body, dict):  # a missing field
                path.append(str(key))
            break
    return ".".join(path)


def _lone_surrogate(
    body: Any, at: tuple[int | str, ...]
) -> tuple[tuple[int | str, ...], str] | None:
    """Where in a parsed body a string holds a lone surrogate (JSON allows it, UTF-8 does not).
    Walked with a stack, not recursion: the body may nest as deep as the JSON parser allows."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(body, at)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return where, ascii(v[e.start])
            continue
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        stack.extend((x, (*where, k)) for k, x in reversed(list(items)))
    return None


class TokenGuard:
    """ASGI middleware: with a token set, only callers that prove they hold it (the gateway) get
    in; every answer to a request that sent a nonce proves this worker holds it too."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        nonce, _, mac = headers.get(WORKER_AUTH_HEADER.encode(), b"").partition(b".")
        nonce = nonce[:MAX_NONCE]
        if nonce:
            send = _proving(send, worker_mac(self.token, b"answer", nonce))
        sent = headers.get(WORKER_TOKEN_HEADER.encode(), b"")
        if not (
            nonce and hmac.compare_digest(mac, worker_mac(self.token, b"request", nonce))
        ) and not hmac.compare_digest(sent, self.token):
            refused = APIError(
                401,
                "this worker answers only its gateway; send requests to the gateway",
                kind="auth_error",
                code="invalid_worker_token",
            )
            await refused.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _proving(send: Send, proof: bytes) -> Send:
    """`send` with the worker's proof added to the answer's headers."""

    async def send_with_proof(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (
                WORKER_PROOF_HEADER.encode(), proof)]}  # fmt: skip
        await send(message)

    return send_with_proof
