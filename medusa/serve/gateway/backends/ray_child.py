"""A worker a SliceActor started as its child on a Ray node (`medusa run`): the ray back-end's
WorkerHandle."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from functools import cached_property
from typing import Any

import httpx
import ray
from ray.exceptions import RayError

from medusa.serve.gateway.hop import Hop
from medusa.serve.gateway.worker_link import connect

# A start that failed: in Ray, or shipping the artifact (ArtifactError is a ValueError).
START_ERRORS = (RayError, OSError, ValueError)


def why(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


class RayChild:
    def __init__(self, actor: Any, node: str, started: concurrent.futures.Future[Any]) -> None:
        """`started`: the ref of the actor's start() (submitted off the event loop)."""
        self.host, self.port, self.token, self.node = "", 0, "", node
        self.uds = ""  # NOTE: TCP to its node; its answers prove they come from it (worker_link)
        self._pid, self._error = 0, ""
        self._code: int | None = None
        self._lost = False  # its actor (its node) is gone: Ray refuses calls to it
        self.actor, self._started = actor, started  # its slice's actor

    @property
    def pid(self) -> int:
        return self._pid

    @cached_property
    def client(self) -> httpx.AsyncClient:
        assert self.port, "the worker is not placed yet"
        return connect("", self.host, self.port, self.token)

    @cached_property
    def hop(self) -> Hop:
        assert self.port, "the worker is not placed yet"
        return Hop("", self.host, self.port, self.token)

    def poll(self) -> int | None:
        return self._code

    def last_error(self) -> str:
        if self._error:
            return self._error
        return "it is still running" if self._code is None else f"it exited with {self._code}"

    def _end(self, code: int, reason: str) -> None:
        if self._code is None:
            self._code, self._error = code, reason

    async def placed(self, timeout: float) -> bool:
        try:
            start = await asyncio.wrap_future(self._started)
            info = await asyncio.wait_for(asyncio.wrap_future(start.future()), timeout)
        except asyncio.TimeoutError:
            self._end(-1, f"its slice actor did not start it in {timeout:.0f} s")
            return False
        except START_ERRORS as e:
            self._end(-1, f"its slice actor on node {self.node[:12]} could not start it: {why(e)}")
            return False
        self.host, self.port, self.token, self._pid = (
            info["host"],
            info["port"],
            info["token"],
            info["pid"],
        )
        self.actor.wait.remote(self._pid).future().add_done_callback(self._on_exit)
        return self._code is None

    def _on_exit(self, fut: concurrent.futures.Future[tuple[int, str]]) -> None:
        # NOTE: runs on a Ray thread; it only sets fields the event loop polls.
        try:
            code, reason = fut.result()
        except RayError as e:
            self._lost = True
            self._end(-9, f"its node {self.node[:12]} (or its slice actor) was lost: {why(e)}")
            return
        self._end(code, reason)

    async def exited(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._code is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self._code is not None

    def terminate(self) -> None:
        """Stops it if it runs (one not yet placed is stopped by `reap`)."""
        if not self._lost and self._pid:
            self.actor.stop.remote(self._pid, 10.0)

    async def reap(self, timeout: float = 10.0) -> None:
        """Stops `medusa run`; the slice actor stays, for the slice's next worker."""
        if not self._lost:
            try:
                pid = self._pid
                if not pid:  # not placed yet: stopped once its start returns its pid
                    start = await asyncio.wrap_future(self._started)
                    info = await asyncio.wait_for(asyncio.wrap_future(start.future()), timeout + 30)
                    pid = info["pid"]
                stop = self.actor.stop.remote(pid, timeout)
                await asyncio.wait_for(asyncio.wrap_future(stop.future()), timeout + 30.0)
            except (*START_ERRORS, asyncio.TimeoutError):
                pass  # never started, or lost with its node
        self._end(-15, "stopped by the gateway")
        if "client" in self.__dict__:
            await self.client.aclose()
        if "hop" in self.__dict__:
            self.hop.close()


__all__ = ["RayChild", "START_ERRORS", "why", "ray"]
