"""The gateway's log of a cold start as it happens: each start-up stage a starting worker reports
(its /health, or a pooled worker's /pool, says the stage under way) is logged at INFO once, with
the model, the worker's pid and its slice."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx

from medusa.serve.gateway.instance import Instance

log = logging.getLogger("medusa.gateway")

# The engine's start-up stages (medusa.engine.startup), as the log says them. Any other word a
# worker sends is not logged: the log holds only what the gateway wrote.
STAGES = {
    "runtime_init": "initializing the device runtime",
    "weights_alloc": "allocating the weights",
    "weights_load": "loading the weights",
    "tokenizer": "loading the tokenizer",
    "workspace": "allocating the workspace",
    "kv_profile": "profiling the KV-cache size",
    "kv_restore": "sizing the KV cache for this device from the artifact",
    "kv_alloc": "allocating the KV cache",
    "graph_capture": "capturing the decode graphs",
    "graph_restore": "restoring the decode graphs from the artifact",
    "validate": "validating the restored graphs",
}


class StartLog:
    """One starting worker's stages, each logged the first time it is reported."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.seen: set[str] = set()

    def saw(self, answer: httpx.Response) -> None:
        """ANSWER: the worker's, {"stage": NAME, ...} (503) while it starts."""
        try:
            body: Any = answer.json() if answer.status_code == 503 else None
        except ValueError:  # not JSON: not a stage
            return
        stage = body.get("stage") if isinstance(body, dict) else None
        if not isinstance(stage, str) or stage not in STAGES or stage in self.seen:
            return
        self.seen.add(stage)
        inst = self.inst
        log.info("%s (worker pid %d on %s): %s", inst.model, inst.proc.pid, inst.slice.id,
                 STAGES[stage])  # fmt: skip

    async def watch(self, client: httpx.AsyncClient, path: str, done: asyncio.Event) -> None:
        """Polls PATH until DONE is set (a pooled worker's /pool while its assignment runs)."""
        while not done.is_set():
            try:
                self.saw(await client.get(path, timeout=2.0))
            except httpx.HTTPError:
                pass  # the assignment's answer says what failed
            # NOTE: not a sleep: the start that set DONE waits for this watch to end (a sleep
            # held every pooled start's first request back by up to 0.1 s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.1)
