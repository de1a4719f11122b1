"""The serving logic the worker's completions and chat completions share (as vLLM's
OpenAIServing): what is refused before and after the prompt is tokenized, the generation with its
metrics, and the answer, whole or as server-sent events. ServingCompletion and ServingChat say
what differs: how a prompt becomes tokens and what a choice looks like."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from medusa.engine.sampling import SamplingParams
from medusa.serve.async_engine import AsyncEngine, EngineFailed, Output
from medusa.serve.protocol import APIError, SamplingRequest, error_body
from medusa.serve.stop_filter import StopFilter

if TYPE_CHECKING:
    from medusa.engine.tokenizer import Tokenizer
    from medusa.serve.server_metrics import ServerMetrics


async def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of `text`, off the event loop: a long prompt takes seconds to tokenize."""
    # NOTE: the tokenizers binding holds the GIL in encode() and releases it in encode_batch().
    batch = await asyncio.to_thread(tok.tk.encode_batch, [text], add_special_tokens=False)
    return list(batch[0].ids)


def require_ready(engine: AsyncEngine) -> None:
    """503 while the engine starts, or once it failed."""
    if not engine.ready.is_set():
        raise APIError(
            503, "the model is still starting", kind="unavailable", headers={"Retry-After": "1"}
        )
    if engine.error:
        what = "failed to start" if engine.engine is None else "failed"
        raise APIError(503, f"the engine {what}: {engine.error}", kind="unavailable")


def _sse(body: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


class OpenAIServing:
    route = ""  # the requests metric's label
    kind = ""  # the answer's "object"
    chunk_kind = ""  # a streamed event's
    id_prefix = ""
    prompt_param = "prompt"  # what a prompt too long for the engine is blamed on

    def __init__(
        self, engine: AsyncEngine, served_name: str, metrics: ServerMetrics, max_pending: int
    ) -> None:
        self.engine, self.served_name = engine, served_name
        self.metrics, self.max_pending = metrics, max_pending

    def choice(self, text: str, reason: str | None, delta: bool) -> dict[str, Any]:
        raise NotImplementedError

    def first_event(self, head: dict[str, Any]) -> dict[str, Any] | None:
        """The event a stream opens with, before any text (None: none)."""
        return None

    def admit(self, req: SamplingRequest) -> Tokenizer:
        """What can be refused before the prompt is tokenized; the tokenizer to do it with."""
        require_ready(self.engine)
        if req.model != self.served_name:
            raise APIError(
                404,
                f"model {req.model!r} is not served here; this worker serves {self.served_name!r}",
                param="model",
                code="model_not_found",
            )
        if req.n != 1:
            raise APIError(400, "n must be 1 (one completion per request)", param="n")
        assert self.engine.engine is not None
        return self.engine.engine.tokenizer

    def prepare(
        self, prompt_ids: list[int], req: SamplingRequest, max_tokens: int
    ) -> SamplingParams:
        """What can be refused once the prompt is tokens; the request's sampling."""
        engine = self.engine
        if engine.num_pending >= self.max_pending:
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
            raise APIError(
                400, str(e), param=self.prompt_param, code="context_length_exceeded"
            ) from None
        stop = req.stop
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                seed=req.seed,
                stop=tuple([stop] if isinstance(stop, str) else stop or ()),
            )
        except ValueError as e:
            raise APIError(400, str(e)) from None

    async def _generate(self, prompt_ids: list[int], sp: SamplingParams) -> AsyncIterator[Output]:
        t0 = time.perf_counter()
        first = last = None
        async for out in self.engine.generate(prompt_ids, sp):
            now = time.perf_counter()
            if first is None:
                first = now
                self.metrics.ttft.observe(now - t0)
            elif last is not None:
                self.metrics.tpot.observe(now - last)
            last = now
            yield out
        self.metrics.requests.labels(self.route, "200").inc()

    async def respond(self, ids: list[int], sp: SamplingParams, *, stream: bool) -> Response:
        head = {
            "id": self.id_prefix + uuid.uuid4().hex[:24],
            "object": self.kind,
            "created": int(time.time()),
            "model": self.served_name,
        }
        gen, outs = self._generate(ids, sp), StopFilter(sp.stop)
        if not stream:
            return await self._whole(head, gen, outs)
        return StreamingResponse(self._events(head, gen, outs), media_type="text/event-stream")

    async def _whole(
        self, head: dict[str, Any], gen: AsyncIterator[Output], outs: StopFilter
    ) -> JSONResponse:
        text, last = "", None
        try:
            async for out in gen:
                text += outs.push(out)
                last = out
        except EngineFailed as e:
            self.metrics.requests.labels(self.route, "503").inc()
            raise APIError(503, f"the engine failed: {e}", kind="unavailable") from None
        assert last is not None
        text += outs.flush()
        usage = {
            "prompt_tokens": last.num_prompt_tokens,
            "completion_tokens": last.num_completion_tokens,
            "total_tokens": last.num_prompt_tokens + last.num_completion_tokens,
        }
        choices = [self.choice(text, last.finish_reason, False)]
        return JSONResponse({**head, "choices": choices, "usage": usage})

    async def _events(
        self, head: dict[str, Any], gen: AsyncIterator[Output], outs: StopFilter
    ) -> AsyncIterator[bytes]:
        head = {**head, "object": self.chunk_kind}
        first = self.first_event(head)
        if first is not None:
            yield _sse(first)
        try:
            async for out in gen:
                text = outs.push(out) + (outs.flush() if out.finished else "")
                reason = out.finish_reason if out.finished else None
                if text or reason:
                    yield _sse({**head, "choices": [self.choice(text, reason, True)]})
        except EngineFailed as e:  # NOTE: the status went out with the first chunk
            self.metrics.requests.labels(self.route, "503").inc()
            yield _sse(error_body(f"the engine failed: {e}", "unavailable", None, None))
            return
        yield b"data: [DONE]\n\n"
