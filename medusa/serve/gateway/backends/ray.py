"""The ray back-end: one `SliceActor` per slice of the cluster, which Ray places on the node that
advertises the slice (`medusa_slice_<class>` resources) and supervises; a worker is `medusa run`
started by its slice's actor. The gateway's slices are those actors: the list follows nodes that
join (their slices are added once their actors run) and nodes that are lost (their slices go).

Whoever can join a Ray cluster runs code as its user on every node: a cluster the gateway starts
(no address) asks for a token only this user can read; one it joins is the user's to guard
(Ray's token authentication, a private network). Its workers listen on their node's address and
answer only their token; they do not weave (no shared directory across nodes)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medusa.child import ROOT
from medusa.prism.ledger import Holder
from medusa.serve.gateway.backends.base import WorkerBackend
from medusa.serve.gateway.backends.ray_auth import private_token
from medusa.serve.gateway.backends.resources import (
    class_slice,
    cluster_slices,
    node_resources,
    resource_name,
)
from medusa.serve.gateway.config import ConfigError, GatewayConfig
from medusa.serve.gateway.private_dir import PrivateDir
from medusa.serve.gateway.slice_ledger import SliceLedger
from medusa.serve.gateway.slices import Slice, discover_slices
from medusa.serve.gateway.worker_handle import WorkerHandle

log = logging.getLogger("medusa.gateway")

try:
    import ray
    from ray.exceptions import RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from medusa.serve.gateway.backends.ray_child import RayChild, why
    from medusa.serve.gateway.backends.ray_slice_actor import SliceActor
except ImportError:  # the [ray] extra is not installed
    ray = None  # type: ignore[assignment]

REFRESH_SECONDS = 1.0  # how often the gateway asks Ray which nodes are alive
READY_SECONDS = 120.0  # for the first slice actors, at start
# NOTE: a ledger call is a round trip to a live actor (about a millisecond here), made from the
# event loop as placement needs it; a node that stopped answering must not hold the loop longer.
LEDGER_SECONDS = 2.0


@dataclass
class _Held:
    """A slice actor the gateway holds: its slice once it runs, and whether it was lost."""

    actor: Any
    node: str
    kind: str
    info: concurrent.futures.Future[dict[str, str]]
    slice: Slice | None = None
    lost: bool = False  # set from a Ray thread when the actor (or its node) dies


def _check_reachable(address: str) -> None:
    """Fails in seconds where ray.init would retry for minutes: nothing listens at ADDRESS."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--cluster ray://{address}: expected ray://HOST:PORT (e.g. HOST:6379)")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise ValueError(
            f"--cluster ray://{address}: nothing answers there ({e.strerror or e}); start the "
            "cluster's head with `ray start --head` and give the address it prints"
        ) from None


class RayLedger:
    """An elastic slice's page ledger on its node, through the slice's actor (SliceLedger). A
    lost actor's ledger has no free pages and no holders: it went with its node."""

    def __init__(self, held: _Held, pages: int, page_bytes: int) -> None:
        self._held, self.capacity = held, pages
        self.path = Path(self._get("", "open", lambda a: a.open_ledger.remote(pages, page_bytes)))

    def _get(self, default: Any, what: str, call: Any) -> Any:
        if self._held.lost:
            return default
        try:
            return ray.get(call(self._held.actor), timeout=LEDGER_SECONDS)
        except RayError as e:  # GetTimeoutError is one
            slc = self._held.slice.id if self._held.slice else self._held.node[:8]
            log.warning("ray: the page ledger of slice %s: %s failed: %s", slc, what, why(e))
            return default

    def _call(self, default: Any, method: str, *args: Any) -> Any:
        return self._get(default, method, lambda a: a.ledger.remote(method, *args))

    def free(self) -> int:
        return int(self._call(0, "free"))

    def holders(self) -> list[Holder]:
        return list(self._call([], "holders"))

    def hold(self, name: str, pages: int) -> bool:
        return bool(self._call(False, "hold", name, pages))

    def drop(self, name: str) -> None:
        self._call(None, "drop", name)

    def remove(self) -> None:
        self._call(None, "remove")


class RayBackend(WorkerBackend):
    name = "ray"

    def __init__(self, address: str | None) -> None:
        if ray is None:
            raise ValueError(
                "--cluster ray needs Ray: pip install 'medusa[ray]' (or pip install 'ray>=2.40')"
            )
        self.address = address
        self._source: Any = None
        self._shipments: dict[tuple[str, str], Any] = {}
        self._nodes: concurrent.futures.Future[list[dict[str, Any]]] | None = None
        # NOTE: Ray calls that may wait (listing nodes, the first shipment of an artifact, an
        # actor's creation) run here, never on the event loop.
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="medusa-ray")
        self._next_refresh = 0.0
        self._held: list[_Held] = []
        self._shipping = threading.Lock()  # one source actor, each artifact put once
        self._dir: PrivateDir | None = None  # the token of a cluster it starts

    def check(self, config: GatewayConfig) -> None:
        tp = sorted(m.name for m in config.models.values() if m.tensor_parallel_size > 1)
        if tp:
            raise ConfigError(
                f"models.{tp[0]}: a tensor-parallel model's ranks share one machine's slices; "
                "the ray back-end places one slice per worker: serve it with --cluster local"
            )

    def discover(self, topology: str | list[Any] | None) -> list[Slice]:
        # NOTE: the actors import medusa from where this process did (a checkout or the
        # installed package), as medusa.child's children do.
        runtime_env = {"env_vars": {"PYTHONPATH": ROOT}}
        address = self.address or os.environ.get("RAY_ADDRESS")
        if address:
            if self.address:  # RAY_ADDRESS may be "auto": Ray resolves it
                _check_reachable(address)
            try:
                ray.init(address=address, runtime_env=runtime_env, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError) as e:
                raise ValueError(
                    f"--cluster ray://{address}: cannot join a Ray cluster there ({why(e)}); give "
                    "the address `ray start --head` printed (HOST:6379 by default)"
                ) from None
        else:  # a one-node cluster on this machine, with this machine's slices
            self._dir = private_token()
            resources = node_resources(discover_slices(topology))
            # NOTE: "local": a new cluster even where one runs already on this machine
            # (Ray joins the one it last started otherwise: someone else's, or a test's).
            ray.init(
                address="local",
                resources=resources,
                runtime_env=runtime_env,
                include_dashboard=False,
                logging_level=logging.WARNING,
            )
        self._grow(ray.nodes())
        self._source_actor()  # now, not on the first cold start's path (a process to start)
        concurrent.futures.wait([h.info for h in self._held], timeout=READY_SECONDS)
        slices: list[Slice] = []
        self._adopt(slices)
        if not slices:
            raise ValueError(
                f"no node of the Ray cluster at {address or 'this machine'} has a free "
                "medusa_slice_* resource: start nodes with ray start --resources "
                '"$(python -m medusa.serve.gateway.backends.resources --slices slices.yaml)"'
            )
        return slices

    def open_ledger(self, slc: Slice, pages: int, page_bytes: int) -> SliceLedger:
        """Made on the slice's node by its actor, which names it to the workers it starts."""
        return RayLedger(next(h for h in self._held if h.slice is slc), pages, page_bytes)

    def launch(self, slc: Slice, args: list[str], local_env: dict[str, str]) -> WorkerHandle:
        # NOTE: local_env is dropped: it names a descriptor of the gateway's process, and a
        # node checks its own copy of an artifact.
        held = next(h for h in self._held if h.slice is slc)
        started = self._pool.submit(self._start, held.actor, args)
        return RayChild(held.actor, held.node, started)

    async def assignment(
        self, worker: WorkerHandle, args: list[str], store_checked: str
    ) -> tuple[list[str], str]:
        """A pooled worker restores the node's verified copy of the artifact, which its slice
        actor fetches (shipped once per node, as for a started worker)."""
        if "--artifact" not in args:
            return args, ""
        assert isinstance(worker, RayChild), worker
        at = args.index("--artifact") + 1
        shipment = await asyncio.wrap_future(self._pool.submit(self._shipment, Path(args[at])))
        try:
            path = await asyncio.wrap_future(worker.actor.fetch.remote(shipment).future())
        except RayError as e:
            raise ValueError(f"its node could not fetch the artifact: {why(e)}") from None
        return [*args[:at], str(path), *args[at + 1 :]], ""

    def _start(self, actor: Any, args: list[str]) -> Any:
        shipment = None
        if "--artifact" in args:
            shipment = self._shipment(Path(args[args.index("--artifact") + 1]))
        return actor.start.remote(args, shipment)

    def _shipment(self, path: Path) -> Any:
        with self._shipping:
            return self._ship(path)

    def _ship(self, path: Path) -> Any:
        from medusa.serve.gateway.artifact_cache import artifact_files, ship

        digest, _ = artifact_files(path)  # a re-materialized artifact is shipped again
        key = (str(path), digest)
        if key not in self._shipments:
            self._shipments[key] = ship(path, self._source_actor())
            log.info("ray: shipping artifact %s (digest %s) to nodes", path, digest[:12])
        return self._shipments[key]

    def _source_actor(self) -> Any:
        """The actor that serves chunks of shipped artifacts, on this (the gateway's) node."""
        from medusa.serve.gateway.artifact_cache import ArtifactSource

        if self._source is None:
            here = ray.get_runtime_context().get_node_id()
            strategy = NodeAffinitySchedulingStrategy(here, soft=False)
            options = ArtifactSource.options  # type: ignore[attr-defined]  # @ray.remote adds it
            self._source = options(scheduling_strategy=strategy).remote()
        return self._source

    def refresh(self, slices: list[Slice]) -> None:
        self._adopt(slices)
        if self._nodes is not None and self._nodes.done():
            try:
                nodes = self._nodes.result()
            except RayError as e:
                log.warning("ray: could not list the cluster's nodes: %s", why(e))
            else:
                alive = {str(n["NodeID"]) for n in nodes if n.get("Alive")}
                for h in self._held:
                    h.lost = h.lost or h.node not in alive
                self._grow(nodes)
            self._nodes = None
        if self._nodes is None and time.monotonic() >= self._next_refresh:
            self._next_refresh = time.monotonic() + REFRESH_SECONDS
            self._nodes = self._pool.submit(ray.nodes)

    def _grow(self, nodes: list[dict[str, Any]]) -> None:
        """A slice actor for each slice a live node advertises and no held actor has yet."""
        for node, kind, count in cluster_slices(nodes):
            have = sum(1 for h in self._held if (h.node, h.kind) == (node, kind) and not h.lost)
            for _ in range(count - have):
                strategy = NodeAffinitySchedulingStrategy(node, soft=False)
                actor = SliceActor.options(  # type: ignore[attr-defined]
                    resources={resource_name(kind): 1}, scheduling_strategy=strategy
                ).remote(kind)
                held = _Held(actor, node, kind, actor.info.remote().future())
                actor.alive.remote().future().add_done_callback(
                    lambda _, h=held: setattr(h, "lost", True)
                )
                self._held.append(held)

    def _adopt(self, slices: list[Slice]) -> None:
        """Adds the slices of actors that now run; drops lost ones (a busy one once free)."""
        for h in list(self._held):
            if h.slice is None and h.info.done() and not h.lost:
                try:
                    info = h.info.result()
                except RayError as e:
                    log.warning("ray: a slice actor on node %s failed: %s", h.node[:12], why(e))
                    h.lost = True
                else:
                    h.slice = class_slice(h.kind, f"{h.node[:8]}/{info['slice']}")
                    slices.append(h.slice)
                    log.info("ray: slice %s joined", h.slice.id)
            if h.lost and (h.slice is None or not h.slice.busy):
                self._held.remove(h)
                if h.slice in slices:
                    slices.remove(h.slice)
                    log.info("ray: slice %s lost (its node or its actor)", h.slice.id)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if ray.is_initialized():
            await asyncio.to_thread(ray.shutdown)
        if self._dir is not None:
            self._dir.remove()
