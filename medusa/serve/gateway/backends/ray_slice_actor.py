"""What runs on a Ray node for the gateway: one `SliceActor` per slice. Ray places it on a node
with a free `medusa_slice_<class>` resource and holds that resource for it; the actor takes one
slice of that class on the node (a lock file, so two actors never share one) and, when asked,
fetches an artifact into the node's cache and starts `medusa run` there as a child process (the
recorder's LD_PRELOAD and the restore work as with the local back-end). The child dies with the
actor: a lost node loses its workers. An elastic slice's page ledger is made by its actor on the
node (`open_ledger`), named in the env of every worker started there; the gateway reads it and
holds its weight rows through the actor (`ledger`), and its rows die with the actor's process.

NOTE: one actor per slice for the slice's life, not per worker: making an actor starts a Python
process (about 1.2 s here), which would be on every cold start's path."""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path
from typing import Any

import ray

from medusa import env
from medusa.serve.gateway.artifact_cache import ArtifactCache, Shipment, cache_root
from medusa.serve.gateway.backends.child_process import ChildProcess, launch
from medusa.serve.gateway.backends.resources import class_slice, resource_name
from medusa.serve.gateway.claims import claim, device_of
from medusa.serve.gateway.private_dir import PrivateDir
from medusa.serve.gateway.slice_ledger import FileLedger
from medusa.serve.gateway.slices import Slice, nvml_slices
from medusa.serve.listeners import bind_tcp


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


LEDGER_METHODS = ("free", "holders", "hold", "drop", "remove")


@ray.remote(num_cpus=0, max_restarts=0)
class SliceActor:
    def __init__(self, kind: str) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        self.cache = ArtifactCache(cache_root(self.node_id))
        self.slice = self._take_slice(kind)
        self.procs: dict[int, ChildProcess] = {}  # by pid, until stopped
        self._ledger: FileLedger | None = None
        self._dir: PrivateDir | None = None  # the ledger's (made with it)
        self._turn = asyncio.Lock()  # one start at a time (an artifact is fetched once)

    def info(self) -> dict[str, str]:
        return {"node": self.node_id, "slice": self.slice.id}

    async def alive(self) -> None:
        """Never returns: its result is an error once the actor (or its node) is gone."""
        await asyncio.Event().wait()

    async def fetch(self, shipment: Shipment) -> str:
        """The node-local, verified copy of the shipped artifact (fetched once per node)."""
        return str(await self.cache.ensure(shipment))

    async def start(self, args: list[str], shipment: Shipment | None) -> dict[str, Any]:
        """Starts `medusa run ARGS` on this actor's slice; its address, token and pid. One at a
        time, unless the slice is elastic (it has a page ledger): its models' workers share it."""
        async with self._turn:
            return await self._start(args, shipment)

    async def _start(self, args: list[str], shipment: Shipment | None) -> dict[str, Any]:
        if self._ledger is None and any(p.poll() is None for p in self.procs.values()):
            raise RuntimeError(f"slice {self.slice.id} on node {self.node_id[:12]} is in use")
        args = list(args)
        if shipment is not None:
            args[args.index("--artifact") + 1] = await self.fetch(shipment)
        # NOTE: started from the actor's event-loop thread, which lives as long as the actor:
        # the child's parent-death signal fires when the thread that forked it ends.
        slice_env = dict(self.slice.env)
        if self._ledger is not None:
            slice_env[env.KV_LEDGER.name] = str(self._ledger.path)
        # NOTE: the actor binds the worker's port (one the kernel picks) and hands the socket
        # down: no port number is chosen before it is held, so nobody can take it first. The
        # token goes back to the gateway through Ray, never over the worker's port.
        proc = launch(slice_env, args, bind_tcp(ray.util.get_node_ip_address()))
        self.procs[proc.pid] = proc
        return {"host": proc.host, "port": proc.port, "token": proc.token, "pid": proc.pid}

    def open_ledger(self, pages: int, page_bytes: int) -> str:
        """Makes this slice's page ledger on the node (once); its path there."""
        if self._ledger is None:
            self._dir = self._dir or PrivateDir()
            self._ledger = FileLedger(self.slice.id, pages, page_bytes, self._dir.path)
        return str(self._ledger.path)

    def ledger(self, method: str, *args: Any) -> Any:
        """SliceLedger's `method` on this slice's ledger, for the gateway."""
        if method not in LEDGER_METHODS:
            raise ValueError(f"ledger method {method!r}: expected one of {LEDGER_METHODS}")
        if self._ledger is None:
            raise RuntimeError(f"slice {self.slice.id}: no page ledger; open_ledger first")
        result = getattr(self._ledger, method)(*args)
        if method == "remove":
            self._ledger = None
            if self._dir is not None:
                self._dir.remove()
                self._dir = None
        return result

    def _take_slice(self, kind: str) -> Slice:
        locks = self.cache.root / "slices"
        locks.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        for slc in _node_slices(kind, self.node_id):
            fd = os.open(locks / f"{Path(slc.id).name}.lock", flags, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            device = device_of(slc)  # a real one: not while a local gateway holds it either
            self._claim = claim(device) if device else None
            if device and self._claim is None:
                os.close(fd)
                continue
            self._lock = fd  # held (the slice is ours) until this actor's process ends
            return slc
        raise RuntimeError(
            f"node {self.node_id[:12]}: Ray placed a slice actor here for {resource_name(kind)} "
            "but every slice of that class is taken; the node advertises more than it has"
        )

    async def wait(self, pid: int) -> tuple[int, str]:
        """Returns once the `medusa run` started as `pid` has ended: (exit status, last stderr
        line)."""
        proc = self.procs.get(pid)
        if proc is None:
            return -15, "stopped by the gateway"
        while not await proc.exited(3600.0):
            pass
        return int(proc.poll() or 0), proc.last_error()

    async def stop(self, pid: int, timeout: float) -> None:
        proc = self.procs.pop(pid, None)
        if proc is not None:
            await proc.reap(timeout)
