"""The worker's OpenAI-compatible API: completions and chat completions (with SSE streaming),
models, health and Prometheus metrics, over one engine."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, Field

from medusa.engine.sampling import SamplingParams
from medusa.serve.async_engine import AsyncEngine, Output


class _Sampling(BaseModel):
    """Fields completions and chat completions share."""

    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = 1


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    max_tokens: int = 16


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


class APIError(Exception):
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
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )
        self.headers = headers


def _error(status: int, message: str, **kw: Any) -> JSONResponse:
    body = {
        "error": {
            "message": message,
            "type": kw.get("kind", "invalid_request_error"),
            "param": kw.get("param"),
            "code": kw.get("code"),
        }
    }
    return JSONResponse(body, status_code=status, headers=kw.get("headers"))


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


def create_app(engine: AsyncEngine, served_name: str, *, max_pending: int = 256) -> FastAPI:
    app = FastAPI(title="medusa worker")
    metrics = Metrics()
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return _error(
            e.status, e.message, param=e.param, code=e.code, kind=e.kind, headers=e.headers
        )

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(400, f"the request body is not valid JSON ({first.get('ctx', {})})")
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = f"{where or 'body'}: {first.get('msg', 'invalid request')}"
        return _error(400, msg, param=where or None)

    def ready() -> None:
        if not engine.ready.is_set():
            raise APIError(
                503, "the model is still starting", kind="unavailable", headers={"Retry-After": "1"}
            )
        if engine.error:
            raise APIError(503, f"the engine failed to start: {engine.error}", kind="unavailable")

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

    def prepare(
        model: str, prompt_ids: list[int], params: dict[str, Any], n: int
    ) -> SamplingParams:
        if model != served_name:
            raise APIError(
                404,
                f"model {model!r} is not served here; this worker serves {served_name!r}",
                param="model",
                code="model_not_found",
            )
        if n != 1:
            raise APIError(400, "n must be 1 (one completion per request)", param="n")
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
            raise APIError(400, str(e), param="messages", code="context_length_exceeded") from None
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
    async def completions(req: CompletionRequest) -> Response:
        ready()
        assert engine.engine is not None
        tok = engine.engine.tokenizer
        ids = list(req.prompt) if isinstance(req.prompt, list) else tok.encode(req.prompt)
        sp = prepare(
            req.model,
            ids,
            {
                "max_tokens": req.max_tokens,
                "temperature": req.temperature,
                "top_p": req.top_p,
                "seed": req.seed,
                "stop": req.stop,
            },
            req.n,
        )
        return await respond(ids, sp, chat=False, stream=req.stream)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> Response:
        ready()
        assert engine.engine is not None
        tok = engine.engine.tokenizer
        ids = tok.encode(tok.apply_chat_template([m.model_dump() for m in req.messages]))
        room = max(1, engine.config.max_model_len - len(ids))
        max_tokens = req.max_completion_tokens or req.max_tokens or room
        sp = prepare(
            req.model,
            ids,
            {
                "max_tokens": max_tokens,
                "temperature": req.temperature,
                "top_p": req.top_p,
                "seed": req.seed,
                "stop": req.stop,
            },
            req.n,
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
            async for out in gen:
                text += outs.push(out)
                last = out
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
            async for out in gen:
                text = outs.push(out) + (outs.flush() if out.finished else "")
                reason = out.finish_reason if out.finished else None
                if text or reason:
                    chunk = {**head, "choices": [choice(text, reason, True)]}
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


class StopFilter:
    """Holds back text that may be the start of a stop string; cuts the text at a stop."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, out: Output) -> str:
        if self.stopped:
            return ""
        self.text += out.text
        for s in self.stops:
            i = self.text.find(s)
            if i >= 0:
                self.text, self.stopped = self.text[:i], True
        end = len(self.text) if self.stopped else max(self.sent, len(self.text) - self.hold)
        piece, self.sent = self.text[self.sent : end], end
        return piece

    def flush(self) -> str:
        piece, self.sent = self.text[self.sent :], len(self.text)
        return piece
