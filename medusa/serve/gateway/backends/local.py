"""The local back-end: `medusa run` processes on this machine's slices (NVML, a slices file),
each serving on a Unix socket the gateway binds in a directory only its user can enter, and hands
to it: no TCP port, nothing another local user can reach or take first."""

from __future__ import annotations

from medusa.serve.gateway.backends import WorkerBackend, WorkerHandle
from medusa.serve.gateway.slices import Slice, discover_slices
from medusa.serve.gateway.worker_process import launch
from medusa.serve.listeners import SocketDir


class LocalBackend(WorkerBackend):
    name = "local"

    def __init__(self) -> None:
        self._sockets: SocketDir | None = None

    def discover(self, topology: str | None) -> list[Slice]:
        return discover_slices(topology)

    def launch(self, slc: Slice, args: list[str], local_env: dict[str, str]) -> WorkerHandle:
        if self._sockets is None:
            self._sockets = SocketDir()
        listener, _ = self._sockets.listener()
        return launch({**slc.env, **local_env}, args, listener)

    async def close(self) -> None:
        if self._sockets is not None:
            self._sockets.close()
