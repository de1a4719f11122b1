"""The local back-end: `medusa run` processes on this machine's slices (NVML, a slices file)."""

from __future__ import annotations

from medusa.serve.gateway.backends import WorkerBackend, WorkerHandle
from medusa.serve.gateway.slices import Slice, discover_slices
from medusa.serve.gateway.worker_process import launch


class LocalBackend(WorkerBackend):
    name = "local"

    def discover(self, topology: str | None) -> list[Slice]:
        return discover_slices(topology)

    def launch(self, slc: Slice, args: list[str], local_env: dict[str, str]) -> WorkerHandle:
        proc, _, _ = launch({**slc.env, **local_env}, args)
        return proc
