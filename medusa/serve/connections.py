"""How many connections a server (the gateway, a worker) holds and how long a client may take to
send a request: uvicorn bounds neither (its `limit_concurrency` answers 503 only once a request's
head has arrived, and its keep-alive timer restarts with every byte). A slow client that sends a
byte a second would otherwise hold a descriptor forever, and twenty thousand of them all of them.

Every connection is wrapped (`ConnectionGuard.protocol_class`, given to uvicorn as its HTTP
protocol) and is in one of two states: *waiting* for a request's head (new, between requests, or
part-way through a head) or *busy* (a head has arrived; its answer is not complete). A waiting
connection gets `header_timeout` seconds for the head (then 408 and closed) and at most
MAX_HEAD_BYTES of it (then 431); a busy one gets `body_timeout` seconds from its head for the
body. At `max_connections`, a new connection displaces the oldest waiting one (a slow client,
or an idle keep-alive), so a client that sends its request at once always gets in; only when
every connection is busy is the new one answered 503 with Retry-After, at once.

`fit_descriptors` makes sure the limit leaves descriptors for everything else the process opens
(workers it starts, their sockets, files): at the limit, accept() never meets EMFILE."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("medusa.serve")

MAX_HEAD_BYTES = 64 << 10  # a request line and headers; uvicorn's httptools sets no bound


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 1024
    header_timeout: float = 10.0  # seconds from a connection's start (or its last answer)
    body_timeout: float = 60.0  # seconds from a request's head to the end of its body

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"--max-connections {self.max_connections}: must be at least 1")
        for name in ("header_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {getattr(self, name)}: must be more than 0 seconds")


def fit_descriptors(
    limits: ConnectionLimits, *, per_connection: int, reserve: int, explicit: bool
) -> ConnectionLimits:
    """`limits`, its max_connections lowered to fit this process's descriptors (the soft
    RLIMIT_NOFILE, first raised to the hard one) when it is the default; ValueError naming
    both when an explicit one does not fit. Each connection may hold `per_connection`
    descriptors (the gateway's: its own and one to a worker); `reserve` are kept for the rest."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # NOTE: some containers refuse: fit what there is
    room = max(1, (soft - reserve) // per_connection)
    if limits.max_connections <= room:
        return limits
    if explicit:
        raise ValueError(
            f"--max-connections {limits.max_connections}: this process may open {soft} "
            f"descriptors (ulimit -n), room for {room} connections beside the {reserve} it "
            "keeps for workers and files; lower --max-connections or raise ulimit -n"
        )
    log.warning("serving at most %d connections (ulimit -n is %d)", room, soft)
    return ConnectionLimits(room, limits.header_timeout, limits.body_timeout)


def _raw_error(status: int, reason: str, message: str, code: str, retry: bool) -> bytes:
    """An OpenAI-shaped error answer, whole, that closes the connection."""
    kind = "unavailable" if status == 503 else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(["retry-after: 1"] if retry else []),
    ]
    return ("\r\n".join(head) + "\r\n\r\n" + body).encode()


class _Guarded(asyncio.Protocol):
    """One connection: uvicorn's own HTTP protocol inside, watched (see the module)."""

    guard: ConnectionGuard

    def __init__(self, **kwargs: Any) -> None:
        self.inner: Any = self.guard.inner_class(**kwargs)
        self.transport: asyncio.Transport | None = None
        self.admitted = False  # the inner protocol has the connection
        self.waiting_since: float | None = time.monotonic()
        self.head_bytes = 0  # of a request head not complete yet
        self.cycle: Any = None  # the request it was last seen busy with
        self.busy_since = 0.0

    # NOTE: uvicorn's protocols (httptools and h11 alike) set `cycle` once a request's head has
    # arrived; `response_complete`, `response_started` and `more_body` are its state.
    def waiting(self) -> bool:
        cycle = self.inner.cycle
        return cycle is None or bool(cycle.response_complete)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.admitted = self.guard.admit(self)
        if self.admitted:
            self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.forget(self)
        if self.admitted:
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)
        # NOTE: counted once fed: a chunk that completes a head (and brings body with it) is
        # not a head's bytes.
        if not self.waiting():
            self.head_bytes = 0
            return
        self.head_bytes += len(data)
        if self.head_bytes > MAX_HEAD_BYTES:
            self.answer(431, "Request Header Fields Too Large",
                        f"the request head is longer than {MAX_HEAD_BYTES} bytes",
                        "headers_too_large")  # fmt: skip

    def eof_received(self) -> bool | None:
        if not self.admitted:
            return None
        return self.inner.eof_received()  # type: ignore[no-any-return]

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def answer(self, status: int, reason: str, message: str, code: str) -> None:
        """Ends the connection with an error of our own (before any answer of the app's)."""
        assert self.transport is not None
        if not self.transport.is_closing():
            self.transport.write(_raw_error(status, reason, message, code, status == 503))
            self.transport.close()
        self.guard.forget(self)

    def close(self) -> None:
        assert self.transport is not None
        self.transport.close()
        self.guard.forget(self)

    def check(self, now: float, limits: ConnectionLimits) -> None:
        """Ends the connection if its client is too slow."""
        cycle = self.inner.cycle
        if self.waiting():
            if self.waiting_since is None:
                self.waiting_since = now
            elif now - self.waiting_since > limits.header_timeout:
                if self.head_bytes:
                    self.answer(408, "Request Timeout", "the request's head did not arrive in "
                                f"{limits.header_timeout:g} s", "timeout")  # fmt: skip
                else:
                    self.close()  # an idle keep-alive connection: nothing to answer
            return
        self.waiting_since = None
        if cycle is not self.cycle:
            self.cycle, self.busy_since = cycle, now
        elif cycle.more_body and now - self.busy_since > limits.body_timeout:
            if cycle.response_started:
                self.close()
            else:
                self.answer(408, "Request Timeout", "the request's body did not arrive in "
                            f"{limits.body_timeout:g} s", "timeout")  # fmt: skip


class ConnectionGuard:
    """The connections of one server, oldest first."""

    def __init__(self, limits: ConnectionLimits) -> None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol  # httptools, else h11

        self.limits, self.inner_class = limits, AutoHTTPProtocol
        self.connections: dict[_Guarded, None] = {}
        self._sweeping: asyncio.TimerHandle | None = None
        self.period = max(0.05, min(1.0, limits.header_timeout / 4, limits.body_timeout / 4))

    def protocol_class(self) -> type[asyncio.Protocol]:
        return type("GuardedHTTPProtocol", (_Guarded,), {"guard": self})

    def admit(self, conn: _Guarded) -> bool:
        if len(self.connections) >= self.limits.max_connections:
            victim = next((c for c in self.connections if c.waiting()), None)
            if victim is None:
                conn.answer(503, "Service Unavailable", "every connection is busy; retry "
                            "shortly", "too_many_connections")  # fmt: skip
                return False
            if victim.head_bytes:
                why = "the server is full and this request's head was the slowest; retry"
                victim.answer(503, "Service Unavailable", why, "too_many_connections")
            else:
                victim.close()
        self.connections[conn] = None
        if self._sweeping is None:
            loop = asyncio.get_running_loop()
            self._sweeping = loop.call_later(self.period, self._sweep)
        return True

    def forget(self, conn: _Guarded) -> None:
        self.connections.pop(conn, None)

    def _sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.connections):
            conn.check(now, self.limits)
        loop = asyncio.get_running_loop()
        self._sweeping = loop.call_later(self.period, self._sweep) if self.connections else None


def make_server(app: Any, limits: ConnectionLimits, **config: Any) -> uvicorn.Server:
    """A uvicorn server for `app` whose connections `limits` bound; run it with
    `server.run(sockets=[listener])` (medusa.serve.listeners)."""
    import uvicorn

    guard = ConnectionGuard(limits)
    return uvicorn.Server(
        uvicorn.Config(app, http=guard.protocol_class(), ws="none", **config)  # type: ignore[arg-type]
    )
