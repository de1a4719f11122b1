"""The gateway → worker hop of a forwarded request: a lean HTTP/1.1 client of one worker, on
asyncio and httptools' parser (the one uvicorn uses), with keep-alive connections. httpx cost the
gateway three times the CPU the worker spent answering; this is all a forwarded request needs:
a POST with a body, an answer read whole or passed on as it comes.

Requests carry the worker's auth (an HMAC of a fresh nonce, never the token) and an answer whose
head does not prove the worker holds the token is refused (NotOurWorker) before a byte of it is
read on (medusa.serve.protocol). Failures are httpx.TransportError, as the control plane's (httpx)
are: callers treat both as a worker that is gone."""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator

import httptools
import httpx

from medusa.errors import EngineDeadError
from medusa.serve.gateway.worker_link import NotOurWorker
from medusa.serve.protocol import WORKER_AUTH_HEADER, WORKER_PROOF_HEADER, worker_mac

CONNECT_SECONDS = 5.0
ANSWER_SECONDS = 600.0  # for the head, then between two pieces of the body (a long generation)
IDLE_SECONDS = 4.0  # a kept connection older than this is not reused (uvicorn closes at 5 s)
MAX_IDLE = 32  # connections kept per worker
HIGH_WATER = 1 << 20  # bytes of an answer buffered before the worker is asked to wait


class HopError(EngineDeadError, httpx.TransportError):
    """The worker's connection failed, or it did not answer in time."""


class _Conn(asyncio.Protocol):
    """One connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.complete = self.closed = False
        self.error: BaseException | None = None
        self.wake = asyncio.Event()
        self.idle_since = 0.0
        self.got_bytes = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(HopError(f"the worker closed the connection ({exc or 'no answer'})"))

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(HopError(f"the worker's answer is not HTTP: {e}"))
            self.close()

    def _fail(self, e: BaseException) -> None:
        self.error = self.error or e
        if not self.head.done():
            self.head.set_exception(e)
            self.head.exception()  # NOTE: retrieved: a request nobody waits on is not an error
        self.wake.set()

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self.wake.set()

    def on_message_complete(self) -> None:
        self.complete = True
        self.wake.set()

    # the request's side
    def start(self, request: bytes) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.head = asyncio.get_running_loop().create_future()
        self.headers, self.complete, self.error, self.got_bytes = [], False, None, False
        self.body.clear()
        self.buffered = 0
        assert self.transport is not None
        self.transport.write(request)

    async def piece(self) -> bytes | None:
        """The next piece of the body; None once it is complete."""
        while not self.body:
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), ANSWER_SECONDS)
            except asyncio.TimeoutError:
                raise HopError(f"the worker sent nothing for {ANSWER_SECONDS:.0f} s") from None
        data = self.body.popleft()
        self.buffered -= len(data)
        if self.buffered <= HIGH_WATER // 2 and self.transport is not None:
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def reusable(self) -> bool:
        return (
            self.complete
            and not self.closed
            and self.parser.should_keep_alive()
            and time.monotonic() - self.idle_since < IDLE_SECONDS
        )


class HopResponse:
    """A worker's answer: its status and headers; its body read whole or piece by piece; then
    `close` (the connection goes back to its worker's idle ones if the body was read)."""

    def __init__(self, hop: Hop, conn: _Conn) -> None:
        self._hop, self._conn, self._done = hop, conn, False
        self.status_code = conn.parser.get_status_code()
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in conn.headers}

    async def read(self) -> bytes:
        parts = [p async for p in self.pieces()]
        return b"".join(parts)

    async def pieces(self) -> AsyncIterator[bytes]:
        while (piece := await self._conn.piece()) is not None:
            yield piece
        if not self._done:
            self._done = True
            self._hop.give_back(self._conn)

    def close(self) -> None:
        """An answer not read to its end: its connection is not reused."""
        if not self._done:
            self._done = True
            self._conn.close()


class Hop:
    """The keep-alive connections to one worker (its Unix socket `uds`, else host:port)."""

    def __init__(self, uds: str, host: str, port: int, token: str) -> None:
        self.uds, self.host, self.port, self.token = uds, host, port, token.encode()
        self.idle: list[_Conn] = []

    async def post(self, path: str, body: bytes) -> HopResponse:
        """POST `body` (JSON) to `path`; returns once the answer's head has come and proved
        itself. A kept connection the worker closed meanwhile is replaced, once."""
        conn = self._kept()
        for attempt in (0, 1):
            conn = conn or await self._connect()
            nonce = secrets.token_hex(16).encode()
            conn.start(self._request(path, body, nonce))
            try:
                await asyncio.wait_for(asyncio.shield(conn.head), ANSWER_SECONDS)
                break
            except HopError:
                conn.close()
                if attempt == 0 and conn.idle_since and not conn.got_bytes:
                    conn = None  # NOTE: closed by the worker while idle: it read nothing
                    continue
                raise
            except asyncio.TimeoutError:
                conn.close()
                raise HopError(f"the worker did not answer in {ANSWER_SECONDS:.0f} s") from None
            except BaseException:  # cancelled: the connection is left mid-request
                conn.close()
                raise
        assert conn is not None
        answer = HopResponse(self, conn)
        proof = answer.headers.get(WORKER_PROOF_HEADER, "").encode()
        if not hmac.compare_digest(proof, worker_mac(self.token, b"answer", nonce)):
            answer.close()
            where = self.uds or f"{self.host}:{self.port}"
            raise NotOurWorker(
                f"{where} answered without proving it is the gateway's worker (a port taken by "
                "another program?): its answer was dropped"
            )
        return answer

    def _request(self, path: str, body: bytes, nonce: bytes) -> bytes:
        auth = nonce + b"." + worker_mac(self.token, b"request", nonce)
        head = (
            f"POST {path} HTTP/1.1\r\nhost: worker\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{WORKER_AUTH_HEADER}: "
        ).encode()
        return head + auth + b"\r\n\r\n" + body

    def _kept(self) -> _Conn | None:
        while self.idle:
            conn = self.idle.pop()
            if conn.reusable():
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            if self.uds:
                connecting = loop.create_unix_connection(_Conn, self.uds)
            else:
                connecting = loop.create_connection(_Conn, self.host, self.port)
            _, conn = await asyncio.wait_for(connecting, CONNECT_SECONDS)
        except (OSError, asyncio.TimeoutError) as e:
            raise HopError(f"cannot connect to the worker: {e!r}") from None
        return conn

    def give_back(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        if conn.reusable() and len(self.idle) < MAX_IDLE:
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
