"""The gateway's handle on a worker it started (a `medusa run` process), whichever back-end placed
it: WorkerHandle, which each back-end implements (backends.child_process.ChildProcess here,
backends.ray_child.RayChild on a Ray node); and WorkerAddress, how the records of started and
pooled workers reach theirs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from medusa.serve.gateway.worker_link import connect

if TYPE_CHECKING:
    import httpx

    from medusa.serve.gateway.hop import Hop


class WorkerHandle(Protocol):
    """One started worker. Where it listens (`uds`, a Unix socket, else `host`:`port`), its
    `token` and its `client` are known once `placed()` returned True."""

    host: str
    port: int
    uds: str
    token: str
    node: str  # where it runs ("local", or a Ray node id)

    @property
    def client(self) -> httpx.AsyncClient:
        """The gateway's client of it (medusa.serve.gateway.worker_link); closed by `reap`."""

    @property
    def hop(self) -> Hop:
        """The forwarded requests' client of it (medusa.serve.gateway.hop); closed by `reap`."""

    @property
    def pid(self) -> int: ...  # on its node; 0 until placed

    def poll(self) -> int | None:
        """None while it runs; its exit status once it ended (or its node was lost)."""

    def last_error(self) -> str:
        """Why it ended (its last stderr line), or how."""

    async def placed(self, timeout: float) -> bool:
        """Waits until it runs somewhere and its address is known; False if it never will."""

    async def exited(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for it to end."""

    def terminate(self) -> None: ...

    async def reap(self, timeout: float = 10.0) -> None:
        """Stops it (SIGTERM, SIGKILL after `timeout`) and returns once it is gone."""


class WorkerAddress:
    """Where a worker listens and how the gateway talks to it (a mixin for the records of
    started and pooled workers: their `proc` says, once placed)."""

    proc: WorkerHandle

    @property
    def host(self) -> str:
        return self.proc.host

    @property
    def port(self) -> int:
        return self.proc.port

    @property
    def name(self) -> str:
        """Unique on its machine, fit for a file name: its socket's, else host-port."""
        if self.proc.uds:
            return Path(self.proc.uds).parent.name + "-" + Path(self.proc.uds).stem
        return f"{self.proc.host}-{self.proc.port}"

    @property
    def client(self) -> httpx.AsyncClient:
        """The worker's client: requests go to paths, proven both ways (worker_link)."""
        return self.proc.client

    def connect(self, timeout: float) -> httpx.AsyncClient:
        """A client of its own (the caller closes it)."""
        return connect(self.proc.uds, self.host, self.port, self.proc.token, timeout=timeout)
