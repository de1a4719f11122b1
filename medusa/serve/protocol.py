"""The OpenAI API on the wire, as the worker and the gateway speak it: the request models (with
the bounds that keep a request's cost in proportion to its tokens), OpenAI-shaped errors, and the
request-body reader (size cap, JSON that Python accepts but JSON does not). How the gateway and
its workers prove themselves to each other is medusa.serve.worker_auth."""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from medusa.errors import MedusaError
from medusa.serve import MAX_BODY_BYTES

# No /docs, /redoc or /openapi.json: they describe nothing a client needs, and answered anyone.
NO_DOCS: dict[str, Any] = {"docs_url": None, "redoc_url": None, "openapi_url": None}


M = TypeVar("M", bound=BaseModel)

# What one request may ask for: each bound keeps a request's cost to the worker in proportion to
# the tokens it gets (a 340,000-entry stop list once made 100 tokens take 18 s of event loop).
MAX_STOPS = 16  # OpenAI allows 4
MAX_STOP_CHARS = 256
MAX_MESSAGES = 4096
MAX_TOKENS = 1 << 20
MAX_NAME_CHARS = 256


class SamplingRequest(BaseModel):
    """Fields completions and chat completions share."""

    model_config = ConfigDict(allow_inf_nan=False)

    model: str = Field(max_length=MAX_NAME_CHARS)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 64)
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = 1

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences, not {len(stops)}")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"a stop sequence has at most {MAX_STOP_CHARS} characters")
        return stop


class CompletionRequest(SamplingRequest):
    prompt: str | list[int]
    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS)


class ChatMessage(BaseModel):
    # NOTE: the chat template renders the role verbatim; a role it was not trained on is noise.
    role: Literal["system", "developer", "user", "assistant"]
    content: str


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)


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


async def api_error(_: Request, e: APIError) -> JSONResponse:
    return e.response()


async def http_error(_: Request, e: HTTPException) -> JSONResponse:
    """Starlette's own refusals (404, 405), OpenAI-shaped."""
    return APIError(e.status_code, str(e.detail), headers=dict(e.headers or {})).response()


async def validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
    """A body FastAPI validated against a route's model: 400 naming the first field."""
    first = e.errors()[0] if e.errors() else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    msg = f"{where or 'body'}: {first.get('msg', 'invalid request')}"
    return APIError(400, msg, param=where or None).response()


# An app's answers to errors: every one OpenAI-shaped (FastAPI(exception_handlers=...)).
ERROR_HANDLERS: dict[Any, Any] = {
    Exception: server_error,
    APIError: api_error,
    HTTPException: http_error,
}


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
