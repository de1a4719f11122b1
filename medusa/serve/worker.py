"""The worker's OpenAI-compatible API: completions and chat completions (with SSE streaming),
models, health and Prometheus metrics, over one engine."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException

from medusa import env
from medusa.engine.sampling import SamplingParams
from medusa.serve.async_engine import AsyncEngine, EngineFailed, Output
from medusa.serve.protocol import (
    MAX_BODY_BYTES,
    NO_DOCS,
    APIError,
    TokenGuard,
    error_body,
    parse,
    read_json,
    server_error,
)
from medusa.serve.stop_filter import StopFilter
from medusa.serve.weaving_routes import mount_weaving

if TYPE_CHECKING:
    from medusa.engine.tokenizer import Tokenizer


async def _encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of `text`, off the event loop: a long prompt takes seconds to tokenize."""
    # NOTE: the tokenizers binding holds the GIL in encode() and releases it in encode_batch().
    batch = await asyncio.to_thread(tok.tk.encode_batch, [text], add_special_tokens=False)
    return list(batch[0].ids)


# What one request may ask for: each bound keeps a request's cost to the worker in proportion to
# the tokens it gets (a 340,000-entry stop list once made 100 tokens take 18 s of event loop).
MAX_STOPS = 16  # OpenAI allows 4
MAX_STOP_CHARS = 256
MAX_MESSAGES = 4096
MAX_TOKENS = 1 << 20
MAX_NAME_CHARS = 256


async def _render(tok: Tokenizer, messages: list[dict[str, str]]) -> str:
    """The prompt the model's chat template makes of `messages`, off the event loop; 400 if the
    template refuses them (raise_exception: roles that do not alternate, say) or fails."""
    import jinja2

    try:
        return await asyncio.to_thread(tok.apply_chat_template, messages)
    except (jinja2.TemplateError, TypeError, ValueError) as e:
        raise APIError(
            400, f"messages: the model's chat template cannot render them: {e}", param="messages"
        ) from None


class _Sampling(BaseModel):
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


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS)


class ChatMessage(BaseModel):
    # NOTE: the chat template renders the role verbatim; a role it was not trained on is noise.
    role: Literal["system", "developer", "user", "assistant"]
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "medusa_requests", "requests answered", ["route", "status"], registry=r
        )
        self.ttft = Histogram(
            "medusa_ttft_seconds",
            "time to first token",
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.tpot = Histogram(
            "medusa_tpot_seconds",
            "time per output token after the first",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
        )
        self.queue = Gauge("medusa_queue_length", "requests waiting or running", registry=r)
        self.startup = Gauge(
            "medusa_startup_seconds", "engine start-up seconds by stage", ["stage"], registry=r
        )


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
    app = FastAPI(title="medusa worker", **NO_DOCS)
    metrics = Metrics()
    app.state.metrics = metrics
    token = env.WORKER_TOKEN.get() if token is None else token
    if token:
        app.add_middleware(TokenGuard, token=token)
    app.add_exception_handler(Exception, server_error)

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        return APIError(e.status_code, str(e.detail), headers=dict(e.headers or {})).response()

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = f"{where or 'body'}: {first.get('msg', 'invalid request')}"
        return APIError(400, msg, param=where or None).response()

    def ready() -> None:
        if not engine.ready.is_set():
            raise APIError(
                503, "the model is still starting", kind="unavailable", headers={"Retry-After": "1"}
            )
        if engine.error:
            what = "failed to start" if engine.engine is None else "failed"
            raise APIError(503, f"the engine {what}: {engine.error}", kind="unavailable")

    @app.get("/health")
    async def health() -> Response:
        if engine.error:
            return JSONResponse({"status": "failed", "error": engine.error}, status_code=500)
        if not engine.ready.is_set():
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": served_name, "object": "model", "created": 0, "owned_by": "medusa"}],
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue.set(engine.num_pending)
        if engine.engine is not None:
            for stage, secs in engine.engine.timings.items():
                metrics.startup.labels(stage).set(secs)
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    def admit(req: _Sampling) -> None:
        """What can be refused before the prompt is tokenized."""
        ready()
        if req.model != served_name:
            raise APIError(
                404,
                f"model {req.model!r} is not served here; this worker serves {served_name!r}",
                param="model",
                code="model_not_found",
            )
        if req.n != 1:
            raise APIError(400, "n must be 1 (one completion per request)", param="n")

    def prepare(route: str, prompt_ids: list[int], params: dict[str, Any]) -> SamplingParams:
        if engine.num_pending >= max_pending:
            raise APIError(
                503,
                f"{engine.num_pending} requests are in flight; try again shortly",
                kind="unavailable",
                headers={"Retry-After": "1"},
            )
        assert engine.engine is not None
        try:
            engine.engine.check_prompt(prompt_ids)
        except ValueError as e:
            where = "messages" if route == "chat" else "prompt"
            raise APIError(400, str(e), param=where, code="context_length_exceeded") from None
        stop = params.pop("stop")
        try:
            return SamplingParams(
                stop=tuple([stop] if isinstance(stop, str) else stop or ()), **params
            )
        except ValueError as e:
            raise APIError(400, str(e)) from None

    async def run(prompt_ids: list[int], sp: SamplingParams, route: str) -> AsyncIterator[Output]:
        t0 = time.perf_counter()
        first = last = None
        count = 0
        async for out in engine.generate(prompt_ids, sp):
            now = time.perf_counter()
            if first is None:
                first = now
                metrics.ttft.observe(now - t0)
            elif last is not None:
                metrics.tpot.observe(now - last)
            last = now
            count += 1
            yield out
        metrics.requests.labels(route, "200").inc()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = parse(CompletionRequest, await read_json(request, max_body_bytes))
        admit(req)
        assert engine.engine is not None
        tok = engine.engine.tokenizer
        prompt = req.prompt
        ids = prompt if isinstance(prompt, list) else await _encode(tok, prompt)
        sp = prepare(
            "completions",
            ids,
            {
                "max_tokens": req.max_tokens,
                "temperature": req.temperature,
                "top_p": req.top_p,
                "seed": req.seed,
                "stop": req.stop,
            },
        )
        return await respond(ids, sp, chat=False, stream=req.stream)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        req = parse(ChatRequest, await read_json(request, max_body_bytes))
        admit(req)
        assert engine.engine is not None
        tok = engine.engine.tokenizer
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            for m in req.messages
        ]
        ids = await _encode(tok, await _render(tok, messages))
        room = max(1, engine.config.max_model_len - len(ids))
        limit = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        max_tokens = room if limit is None else limit
        sp = prepare(
            "chat",
            ids,
            {
                "max_tokens": max_tokens,
                "temperature": req.temperature,
                "top_p": req.top_p,
                "seed": req.seed,
                "stop": req.stop,
            },
        )
        return await respond(ids, sp, chat=True, stream=req.stream)

    async def respond(ids: list[int], sp: SamplingParams, *, chat: bool, stream: bool) -> Response:
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        route = "chat" if chat else "completions"
        kind = "chat.completion" if chat else "text_completion"
        outs = StopFilter(sp.stop)
        gen = run(ids, sp, route)

        def choice(text: str, reason: str | None, delta: bool) -> dict[str, Any]:
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            body = {"content": text} if delta else {"role": "assistant", "content": text}
            return {"index": 0, ("delta" if delta else "message"): body, "finish_reason": reason}

        if not stream:
            text, last = "", None
            try:
                async for out in gen:
                    text += outs.push(out)
                    last = out
            except EngineFailed as e:
                metrics.requests.labels(route, "503").inc()
                raise APIError(503, f"the engine failed: {e}", kind="unavailable") from None
            assert last is not None
            text += outs.flush()
            usage = {
                "prompt_tokens": last.num_prompt_tokens,
                "completion_tokens": last.num_completion_tokens,
                "total_tokens": last.num_prompt_tokens + last.num_completion_tokens,
            }
            return JSONResponse(
                {
                    "id": rid,
                    "object": kind,
                    "created": created,
                    "model": served_name,
                    "choices": [choice(text, last.finish_reason, False)],
                    "usage": usage,
                }
            )

        async def events() -> AsyncIterator[bytes]:
            head = {
                "id": rid,
                "object": kind + ".chunk" if chat else kind,
                "created": created,
                "model": served_name,
            }
            if chat:
                first = {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None,
                        }
                    ],
                }
                yield f"data: {json.dumps(first)}\n\n".encode()
            try:
                async for out in gen:
                    text = outs.push(out) + (outs.flush() if out.finished else "")
                    reason = out.finish_reason if out.finished else None
                    if text or reason:
                        chunk = {**head, "choices": [choice(text, reason, True)]}
                        yield f"data: {json.dumps(chunk)}\n\n".encode()
            except EngineFailed as e:  # NOTE: the status went out with the first chunk
                metrics.requests.labels(route, "503").inc()
                err = error_body(f"the engine failed: {e}", "unavailable", None, None)
                yield f"data: {json.dumps(err)}\n\n".encode()
                return
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    where = env.WEAVING_DIR.get() if weaving_dir is None else weaving_dir
    mount_weaving(app, engine, ready, token, where)
    return app
