"""What runs on a Ray node for the gateway: one `NodeWorker` actor per worker. Ray placed it on a
node with a free `medusa_slice_<class>`; it takes one slice of that class on the node (a lock
file, so two actors never share one), fetches the artifact into the node's cache, and starts
`medusa run` there as a child process (the recorder's LD_PRELOAD and the restore work as with
the local back-end). The child dies with the actor: a lost node loses its workers."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import ray

from medusa.serve.gateway.artifact_cache import ArtifactCache, Shipment, cache_root
from medusa.serve.gateway.backends.resources import class_slice, resource_name
from medusa.serve.gateway.slices import Slice, nvml_slices
from medusa.serve.gateway.worker_process import WorkerProcess, launch


def _node_slices(kind: str, node_id: str) -> list[Slice]:
    """This node's slices of class `kind`: its MIG instances of that profile (NVML), else as many
    simulated ones as the node advertises."""
    try:
        found = [s for s in nvml_slices() if s.kind == kind]
    except Exception:  # noqa: BLE001 - no NVML library or no driver: a CPU node
        found = []
    if found:
        return found
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    count = int(node["Resources"].get(resource_name(kind), 0))
    return [class_slice(kind, f"{kind}#{i}") for i in range(count)]


@ray.remote(num_cpus=0, max_restarts=0)
class NodeWorker:
    def __init__(self) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        self.cache = ArtifactCache(cache_root(self.node_id))
        self.proc: WorkerProcess | None = None
        self._lock: int | None = None

    async def fetch(self, shipment: Shipment) -> str:
        """The node-local, verified copy of the shipped artifact (fetched once per node)."""
        return str(await self.cache.ensure(shipment))

    async def start(self, kind: str, args: list[str], shipment: Shipment | None) -> dict[str, Any]:
        """Starts `medusa run ARGS` on a free slice of class `kind`; its address and token."""
        args = list(args)
        if shipment is not None:
            args[args.index("--artifact") + 1] = await self.fetch(shipment)
        slc = self._take_slice(kind)
        # NOTE: started from the actor's event-loop thread, which lives as long as the actor:
        # the child's parent-death signal fires when the thread that forked it ends.
        self.proc, port, token = launch(slc.env, args, host=ray.util.get_node_ip_address())
        return {
            "host": self.proc.host,
            "port": port,
            "token": token,
            "pid": self.proc.pid,
            "node": self.node_id,
            "slice": slc.id,
        }

    def _take_slice(self, kind: str) -> Slice:
        locks = self.cache.root / "slices"
        locks.mkdir(parents=True, exist_ok=True)
        for slc in _node_slices(kind, self.node_id):
            fd = os.open(locks / f"{Path(slc.id).name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._lock = fd  # held (the slice is ours) until this actor's process ends
            return slc
        raise RuntimeError(
            f"node {self.node_id[:12]}: Ray placed a worker here for {resource_name(kind)} but "
            "every slice of that class is in use; the node advertises more slices than it has"
        )

    async def wait(self) -> tuple[int, str]:
        """Returns once `medusa run` has ended: (exit status, its last stderr line)."""
        assert self.proc is not None, "wait() before start()"
        while not await self.proc.exited(3600.0):
            pass
        return int(self.proc.poll() or 0), self.proc.last_error()

    async def stop(self, timeout: float) -> None:
        if self.proc is not None:
            await self.proc.reap(timeout)
