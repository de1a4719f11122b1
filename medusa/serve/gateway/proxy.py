"""The gateway's forwarding of /v1/completions and /v1/chat/completions: a slot on a warm worker of
the request's model (a Lease; the instance manager starts one if it must), the request sent over
the lean hop (medusa.serve.gateway.hop), the answer relayed whole or as it streams, and one retry
on another instance if the worker is gone before it answered."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from medusa.serve.gateway.admission import prompt_tokens
from medusa.serve.gateway.api_keys import ApiKeys
from medusa.serve.gateway.config import GatewayConfig
from medusa.serve.gateway.errors import QueueFull, Unavailable
from medusa.serve.gateway.forwarding import Relayed, end_stream, request_body, sse_error
from medusa.serve.gateway.hop import HopResponse
from medusa.serve.gateway.instance import Instance, Lease
from medusa.serve.gateway.instances import InstanceManager
from medusa.serve.gateway.metrics import GatewayMetrics
from medusa.serve.protocol import APIError, read_body

log = logging.getLogger("medusa.gateway")


def _error(
    status: int,
    message: str,
    kind: str,
    headers: dict[str, str] | None = None,
    *,
    code: str | None = None,
    param: str | None = None,
) -> JSONResponse:
    return APIError(status, message, kind=kind, headers=headers, param=param, code=code).response()


class Proxy:
    def __init__(
        self,
        config: GatewayConfig,
        manager: InstanceManager,
        metrics: GatewayMetrics,
        api_keys: ApiKeys,
        *,
        wait_timeout: float,
        max_body_bytes: int,
    ) -> None:
        self.config, self.manager, self.metrics, self.api_keys = config, manager, metrics, api_keys
        self.wait_timeout, self.max_body_bytes = wait_timeout, max_body_bytes

    async def forward(self, request: Request, route: str) -> Response:
        if not self.api_keys.allow(request):
            return self.api_keys.refusal()
        raw = await read_body(request, self.max_body_bytes)
        body = request_body(raw)
        model = body.get("model")
        if model not in self.config.models:
            return _error(
                404,
                f"model {model!r} is not in the catalog; available: {sorted(self.config.models)}",
                "invalid_request_error",
                param="model",
                code="model_not_found",
            )
        stream, tokens = bool(body.get("stream")), prompt_tokens(body)
        for attempt in (0, 1):
            lease = await self._lease(model)
            if not isinstance(lease, Lease):
                return lease
            answer = await self._send(lease, route, raw, stream, tokens)
            if answer is not None:
                return answer
            if attempt == 0:
                log.warning("retrying a %s request on another instance", model)
        self.metrics.requests.labels(model, "503").inc()
        return _error(
            503,
            f"{model}: the worker died and no other instance answered",
            "unavailable",
            {"Retry-After": "5"},
        )

    async def _lease(self, model: str) -> Lease | Response:
        """A slot on a warm worker of `model`, or the refusal to answer with."""
        try:
            return await self.manager.acquire(model, self.wait_timeout)
        except QueueFull:
            self.metrics.requests.labels(model, "429").inc()
            return _error(
                429,
                f"{model}: the queue is full ({self.config.models[model].max_queue} "
                "waiting); retry later",
                "rate_limit_error",
                {"Retry-After": "2"},
                code="queue_full",
            )
        except Unavailable as e:
            self.metrics.requests.labels(model, "503").inc()
            headers = {"Retry-After": str(e.retry_after)}
            return _error(503, str(e), "unavailable", headers, code=e.code)

    async def _send(
        self, lease: Lease, route: str, raw: bytes, stream: bool, tokens: int
    ) -> Response | None:
        """The worker's answer, or None if it is gone (its instance is retired). The lease is
        released here on every path, or by the relayed stream once it ends."""
        inst, handed = lease.inst, False
        try:
            await lease.admit(tokens)  # elastic slices: its turn
            t0 = time.perf_counter()
            try:
                resp = await inst.proc.hop.post(route, raw)
                content = None if stream else await resp.read()
            except httpx.TransportError as e:  # NotOurWorker too: never relayed
                log.warning("%s on %s: %s", inst.model, inst.slice.id, e)
                self.manager.mark_dead(inst)
                return None
            if content is not None:
                self.metrics.ttft.labels(inst.model).observe(time.perf_counter() - t0)
                self.metrics.requests.labels(inst.model, str(resp.status_code)).inc()
                media = resp.headers.get("content-type")
                return Response(content, status_code=resp.status_code, media_type=media)
            handed = True
            return Relayed(
                self._relay(resp, inst, t0),
                lambda: end_stream(resp, lease),
                status_code=resp.status_code,
                media_type=resp.headers.get("content-type", "text/event-stream"),
            )
        finally:
            if not handed:
                lease.release()

    async def _relay(self, resp: HopResponse, inst: Instance, t0: float) -> AsyncIterator[bytes]:
        model, last, pending, metrics = inst.model, None, b"", self.metrics
        try:
            async for chunk in resp.pieces():
                now = time.perf_counter()
                if last is None:
                    metrics.ttft.labels(model).observe(now - t0)
                else:
                    metrics.tpot.labels(model).observe(now - last)
                last = now
                # Whole events only: an event cut by a dying worker must not reach the client.
                pending += chunk
                end = pending.rfind(b"\n\n") + 2
                if end > 1:
                    yield pending[:end]
                    pending = pending[end:]
            if pending:
                yield pending
            metrics.requests.labels(model, str(resp.status_code)).inc()
        except httpx.TransportError:
            self.manager.mark_dead(inst)
            metrics.requests.labels(model, "502").inc()
            yield sse_error(f"{model}: the worker stopped in the middle of the answer; retry")
