"""The local back-end: `medusa run` processes on this machine's slices (NVML, a slices file).

Its workers share files with it in a directory of its own (private_dir.PrivateDir, made on first
use): the elastic slices' page ledgers, the Weaver exchange regions (MEDUSA_WEAVING_DIR), and each
worker's Unix socket, which the gateway binds there and hands to the worker: no TCP port, nothing
another local user can reach or take first. It claims the real devices it finds (claims): a
second gateway of this user on them is refused."""

from __future__ import annotations

import itertools
from typing import Any

from medusa import env
from medusa.serve.gateway.backends.base import WorkerBackend
from medusa.serve.gateway.backends.child_process import launch
from medusa.serve.gateway.claims import claim_devices, release
from medusa.serve.gateway.private_dir import PrivateDir
from medusa.serve.gateway.slice_ledger import SliceLedger, file_ledgers
from medusa.serve.gateway.slices import Slice, discover_slices
from medusa.serve.gateway.worker_handle import WorkerHandle
from medusa.serve.listeners import bind_unix


class LocalBackend(WorkerBackend):
    name = "local"
    weaving = True

    def __init__(self) -> None:
        self._dir: PrivateDir | None = None
        self._claims: list[int] = []
        self._sockets = itertools.count(1)

    @property
    def shared_dir(self) -> PrivateDir:
        if self._dir is None:
            self._dir = PrivateDir()
        return self._dir

    def discover(self, topology: str | list[Any] | None) -> list[Slice]:
        slices = discover_slices(topology)
        self._claims = claim_devices(slices)
        return slices

    def launch(self, slc: Slice, args: list[str], local_env: dict[str, str]) -> WorkerHandle:
        shared = {env.WEAVING_DIR.name: str(self.shared_dir.weaving)}
        listener = bind_unix(self.shared_dir.path / f"w{next(self._sockets)}.sock")
        return launch({**slc.env, **shared, **local_env}, args, listener)

    def open_ledger(self, slc: Slice, pages: int, page_bytes: int) -> SliceLedger:
        return file_ledgers(self.shared_dir.path)(slc, pages, page_bytes)

    async def close(self) -> None:
        if self._dir is not None:
            self._dir.remove()
            self._dir = None
        release(self._claims)
