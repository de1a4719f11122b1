"""Prism's local scheduling in the gateway (its Alg. 2): the requests for every model on one elastic
slice wait in one queue, and at most `concurrency` of them are let through to the slice's workers
at a time. Who goes next is Moore-Hodgson's choice over the waiting requests (deadline = arrival
+ the model's slo_ttft, length = prompt tokens / prefill speed): the most of them meet their
deadline; a request that would miss anyway is still served, after those that can make it."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from medusa.prism.schedule import DeviceQueue


def prompt_tokens(body: dict[str, Any]) -> int:
    """A request's prompt length in tokens, as the gateway can guess it without the tokenizer:
    token ids count as they are, text as a token per 4 bytes (what BPE vocabularies average)."""
    parts: list[Any] = []
    prompt = body.get("prompt")
    parts += prompt if isinstance(prompt, list) else [prompt]
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            content = message.get("content")
            parts += content if isinstance(content, list) else [content]
    n = 0
    for p in parts:
        if isinstance(p, int):
            n += 1
        elif isinstance(p, str):
            n += len(p.encode()) // 4 + 1
        elif isinstance(p, list):
            n += len(p)
        elif isinstance(p, dict) and isinstance(p.get("text"), str):
            n += len(p["text"].encode()) // 4 + 1
    return max(1, n)


class SliceQueue:
    """Admission to one elastic slice's workers. `admit` returns once the request may go to its
    worker; every admitted request calls `done` exactly once when its answer has ended."""

    def __init__(
        self,
        prefill_speed: float,
        concurrency: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1 request per slice, got {concurrency}")
        self.queue = DeviceQueue(prefill_speed)
        self.concurrency, self.clock = concurrency, clock
        self.running = 0
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._keys = itertools.count()

    def __len__(self) -> int:
        return len(self._waiting)

    async def admit(self, slo_ttft: float, prompt_tokens: int) -> None:
        if self.running < self.concurrency and not self._waiting:
            self.running += 1
            return
        key = next(self._keys)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = fut
        self.queue.push(key, self.clock(), slo_ttft, max(1, prompt_tokens))
        try:
            await fut
        except asyncio.CancelledError:
            if self._waiting.pop(key, None) is not None:
                self.queue.discard(key)
            elif fut.done() and not fut.cancelled():
                self.done()  # NOTE: admitted, then the client left: hand its place on
            raise

    def done(self) -> None:
        if self.running <= 0:
            raise RuntimeError("SliceQueue.done() without an admitted request")
        self.running -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self.running < self.concurrency and self._waiting:
            key = self.queue.pop(self.clock())
            fut = self._waiting.pop(key)  # type: ignore[call-overload]
            self.running += 1
            fut.set_result(None)


class RateMeter:
    """Requests per second of each model over the last `window` seconds (Prism's measured rate)."""

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        if window <= 0:
            raise ValueError(f"the rate window must be > 0 seconds, got {window}")
        self.window, self.clock = window, clock
        self._arrivals: dict[str, deque[float]] = {}

    def arrived(self, model: str) -> None:
        self._arrivals.setdefault(model, deque()).append(self.clock())

    def rate(self, model: str) -> float:
        times = self._arrivals.get(model)
        if not times:
            return 0.0
        cutoff = self.clock() - self.window
        while times and times[0] < cutoff:
            times.popleft()
        return len(times) / self.window
