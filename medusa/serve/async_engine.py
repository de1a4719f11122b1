"""The engine on its own thread, fed by the HTTP server's event loop. Requests go in through a
queue; each request's outputs come back to the loop through its own asyncio queue."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine, StepOutput
from medusa.engine.sampling import SamplingParams
from medusa.engine.sequence import Sequence
from medusa.errors import EngineDeadError

log = logging.getLogger("medusa.serve")
T = TypeVar("T")
StageFn = Callable[[str], None]  # told each start-up stage's name as it begins
IDLE_POLL = 0.5e-3  # seconds between idle polls of an engine's step hooks (a Weaver receiver)


@dataclass
class Output:
    token: int
    text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_completion_tokens: int
    error: str | None = None  # the engine failed: generate() raises EngineFailed with it


class EngineFailed(EngineDeadError, RuntimeError):
    """The engine failed while serving (a step raised): this request, and every later one, gets
    the reason; /health reports it, so the gateway replaces the worker."""


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    deliver: Callable[[Output], None]
    seq: Sequence | None = None
    created: float = field(default_factory=time.perf_counter)


class AsyncEngine:
    def __init__(
        self, config: EngineConfig, factory: Callable[[StageFn], LLMEngine] | None = None
    ) -> None:
        """factory(on_stage): the engine, built with on_stage as its start-up's stage callback."""
        self.config = config
        self._factory = factory or (lambda on_stage: LLMEngine(config, on_stage=on_stage))
        self.engine: LLMEngine | None = None
        self.error: str | None = None
        self.stage = "starting"  # the start-up stage under way (/health says it)
        self.ready = threading.Event()
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._by_seq: dict[int, _Request] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="medusa-engine", daemon=True)
        self.num_pending = 0  # requests not finished, including those not yet scheduled

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(("stop", None))
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            self.engine = self._factory(self._begin_stage)
        except Exception as e:  # noqa: BLE001 - reported on /health and by `medusa run`
            # NOTE: the one-line reason is the user's message; the traceback is for --verbose.
            log.debug("engine start-up failed", exc_info=True)
            self.error = f"{type(e).__name__}: {e}"
            self.ready.set()
            return
        self.ready.set()
        eng = self.engine
        while not self._stop.is_set():
            failed = self.error is not None
            self._drain(block=failed or not (eng.has_unfinished() or eng.polls_when_idle))
            if failed:
                continue
            if eng.has_unfinished():
                try:
                    outs = eng.step()
                except Exception as e:  # noqa: BLE001 - every request is told, and /health
                    self._fail(e)
                    continue
                for out in outs:
                    self._dispatch(out)
            elif eng.polls_when_idle:  # NOTE: another engine may wait on these (a Weaver receiver)
                try:
                    eng.poll_idle()
                except Exception as e:  # noqa: BLE001 - as a failed step: told, and /health
                    self._fail(e, getattr(eng, "idle_work", "serving a Weaver region") + " failed")
                    continue
                time.sleep(IDLE_POLL)
        eng.shutdown()  # NOTE: its step hooks first (a Weaver receiver stops serving)

    def _begin_stage(self, name: str) -> None:
        self.stage = name

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """fn(engine) on the engine thread, between steps; its result, or its exception."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if not fut.done():
                fut.set_result(value) if ok else fut.set_exception(value)

        def run(eng: LLMEngine) -> None:
            try:
                loop.call_soon_threadsafe(settle, True, fn(eng))
            except Exception as e:  # noqa: BLE001 - handed to the caller, whatever it is
                loop.call_soon_threadsafe(settle, False, e)

        self._inbox.put(("call", run))
        return await fut

    def _fail(self, e: Exception, what: str = "a step failed") -> None:
        """A step raised (e.g. the weights a request needed could not be loaded), or the idle
        poll of a Weaver region did: the engine serves nothing more. Its requests, and those
        that come later, end with the reason."""
        log.error("the engine failed while serving: %s", e, exc_info=True)
        self.error = f"{what}: {type(e).__name__}: {e}"
        for req in list(self._by_seq.values()):
            self._refuse(req)
        self._by_seq.clear()

    def _refuse(self, req: _Request) -> None:
        n = req.seq.num_prompt_tokens if req.seq is not None else len(req.prompt)
        req.deliver(Output(0, "", True, None, n, 0, error=self.error))

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.2) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, req = item
            if kind == "add" and req is not None and self.error is not None:
                self._refuse(req)
            elif kind == "add" and req is not None and self.engine is not None:
                req.seq = self.engine.add_request(req.prompt, req.params)
                self._by_seq[req.seq.seq_id] = req
            elif kind == "call" and self.engine is not None:
                req(self.engine)
            elif kind == "abort" and req is not None and req.seq and self.engine is not None:
                if self.error is None:  # NOTE: a failed engine is not touched again
                    self.engine.abort(req.seq)
                    self._by_seq.pop(req.seq.seq_id, None)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _dispatch(self, out: StepOutput) -> None:
        req = self._by_seq.get(out.seq.seq_id)
        if req is None:
            return
        if out.finished:
            del self._by_seq[out.seq.seq_id]
        s = out.seq
        req.deliver(Output(out.token, out.text, out.finished, s.finish_reason,
                           s.num_prompt_tokens, s.num_completion_tokens))  # fmt: skip

    async def generate(self, prompt: list[int], params: SamplingParams) -> AsyncIterator[Output]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Output] = asyncio.Queue()

        def deliver(o: Output) -> None:
            loop.call_soon_threadsafe(q.put_nowait, o)

        req = _Request(prompt, params, deliver)
        self.num_pending += 1
        self._inbox.put(("add", req))
        try:
            while True:
                out = await q.get()
                if out.error is not None:
                    raise EngineFailed(out.error)
                yield out
                if out.finished:
                    return
        finally:
            self.num_pending -= 1
            if not req.seq or req.seq.status.name != "FINISHED":
                self._inbox.put(("abort", req))
