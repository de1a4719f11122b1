"""The ray back-end: workers are `NodeWorker` actors that Ray places on nodes advertising a free
`medusa_slice_<class>` resource. The gateway keeps, per slice class, as many slices as the live
nodes advertise (they are capacity, not places: Ray picks the node), and keeps that count up to
date as nodes join and are lost."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from medusa.child import ROOT
from medusa.serve.gateway.backends import WorkerBackend, WorkerHandle
from medusa.serve.gateway.backends.resources import (
    class_slice,
    cluster_slices,
    node_resources,
    resource_name,
)
from medusa.serve.gateway.config import ConfigError, GatewayConfig
from medusa.serve.gateway.slices import Slice, discover_slices

log = logging.getLogger("medusa.gateway")

try:
    import ray
    from ray.exceptions import RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError:  # the [ray] extra is not installed
    ray = None  # type: ignore[assignment]

# A start that failed: in Ray, or shipping the artifact (ArtifactError is a ValueError).
_START_ERRORS = (RayError, OSError, ValueError) if ray is not None else ()
REFRESH_SECONDS = 1.0  # how often the gateway asks Ray which nodes are alive


class RayWorker:
    """A worker started by a NodeWorker actor (the ray back-end's WorkerHandle)."""

    def __init__(self, started: concurrent.futures.Future[tuple[Any, Any]], resource: str) -> None:
        self.host, self.port, self.token, self.node = "", 0, "", "(placing)"
        self._pid, self._error = 0, ""
        self._code: int | None = None
        self._gone = False  # its actor is dead: Ray refuses calls to it
        self._started, self._resource = started, resource  # -> (actor, ref to its start())
        self._actor: Any = None

    @property
    def pid(self) -> int:
        return self._pid

    def poll(self) -> int | None:
        return self._code

    def last_error(self) -> str:
        if self._error:
            return self._error
        return "it is still running" if self._code is None else f"it exited with {self._code}"

    def _end(self, code: int, why: str) -> None:
        if self._code is None:
            self._code, self._error = code, why

    async def placed(self, timeout: float) -> bool:
        try:
            self._actor, start = await asyncio.wrap_future(self._started)
            info = await asyncio.wait_for(asyncio.wrap_future(start.future()), timeout)
        except asyncio.TimeoutError:
            self._end(-1, f"Ray found no node with a free {self._resource} in {timeout:.0f} s")
            return False
        except _START_ERRORS as e:
            self._end(-1, f"its Ray actor failed to start it: {_why(e)}")
            return False
        self.host, self.port, self.token = info["host"], info["port"], info["token"]
        self.node, self._pid = info["node"], info["pid"]
        self._actor.wait.remote().future().add_done_callback(self._on_exit)
        return self._code is None

    def _on_exit(self, fut: concurrent.futures.Future[tuple[int, str]]) -> None:
        # NOTE: runs on a Ray thread; it only sets two fields the event loop polls.
        try:
            code, why = fut.result()
        except RayError as e:
            self._gone = True
            self._end(-9, f"its node {self.node[:12]} or its Ray actor was lost ({_why(e)})")
            return
        self._end(code, why)

    async def exited(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._code is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self._code is not None

    def terminate(self) -> None:
        if not self._gone and self._actor is not None:
            self._actor.stop.remote(10.0)

    async def reap(self, timeout: float = 10.0) -> None:
        if self._actor is None:
            try:  # so that the actor, once made, can be killed
                self._actor = (await asyncio.wrap_future(self._started))[0]
            except _START_ERRORS:
                return  # no actor was made
        if self._gone:
            return
        if self.port and self._code is None:
            try:
                stop = asyncio.wrap_future(self._actor.stop.remote(timeout).future())
                await asyncio.wait_for(stop, timeout + 5.0)
            except (RayError, asyncio.TimeoutError):
                pass  # lost with its node: killing the actor is all that is left
        self._gone = True
        ray.kill(self._actor)  # frees its slice resource (a pending actor is never placed)
        self._end(-15, "stopped by the gateway")


def _why(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__


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
        self._seq = 0  # slice ids are never reused
        self._shipping = threading.Lock()  # one source actor, each artifact put once

    def check(self, config: GatewayConfig) -> None:
        if any(config.warm_pool.values()):
            raise ConfigError(
                "warm_pool: the ray back-end has no warm pool yet; set warm_pool: 0 or drop "
                "--cluster ray"
            )

    def discover(self, topology: str | None) -> list[Slice]:
        # NOTE: the actors import medusa from where this process did (a checkout or the
        # installed package), as medusa.child's children do.
        runtime_env = {"env_vars": {"PYTHONPATH": ROOT}}
        address = self.address or os.environ.get("RAY_ADDRESS")
        if address:
            try:
                ray.init(address=address, runtime_env=runtime_env, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError) as e:
                raise ValueError(
                    f"--cluster ray://{address}: cannot join a Ray cluster there ({_why(e)}); give "
                    "the address `ray start --head` printed (HOST:6379 by default)"
                ) from None
        else:  # a one-node cluster on this machine, with this machine's slices
            resources = node_resources(discover_slices(topology))
            ray.init(
                resources=resources,
                runtime_env=runtime_env,
                include_dashboard=False,
                logging_level=logging.WARNING,
            )
        slices: list[Slice] = []
        self._apply(slices, ray.nodes())
        if not slices:
            raise ValueError(
                f"no node of the Ray cluster at {address or 'this machine'} advertises a "
                "medusa_slice_* resource: start nodes with ray start --resources "
                '"$(python -m medusa.serve.gateway.backends.resources --slices slices.yaml)"'
            )
        return slices

    def launch(self, slc: Slice, args: list[str]) -> WorkerHandle:
        resource = resource_name(slc.kind)
        return RayWorker(self._pool.submit(self._start, slc.kind, resource, args), resource)

    def _start(self, kind: str, resource: str, args: list[str]) -> tuple[Any, Any]:
        from medusa.serve.gateway.backends.ray_node import NodeWorker

        shipment = None
        if "--artifact" in args:
            shipment = self._shipment(Path(args[args.index("--artifact") + 1]))
        actor = NodeWorker.options(resources={resource: 1}).remote()  # type: ignore[attr-defined]
        return actor, actor.start.remote(kind, args, shipment)

    def _shipment(self, path: Path) -> Any:
        with self._shipping:
            return self._ship(path)

    def _ship(self, path: Path) -> Any:
        from medusa.serve.gateway.artifact_cache import ArtifactSource, artifact_files, ship

        if self._source is None:
            here = ray.get_runtime_context().get_node_id()
            strategy = NodeAffinitySchedulingStrategy(here, soft=False)
            options = ArtifactSource.options  # type: ignore[attr-defined]  # @ray.remote adds it
            self._source = options(scheduling_strategy=strategy).remote()
        digest, _ = artifact_files(path)  # a re-materialized artifact is shipped again
        key = (str(path), digest)
        if key not in self._shipments:
            self._shipments[key] = ship(path, self._source)
            log.info("ray: shipping artifact %s (digest %s) to nodes", path, digest[:12])
        return self._shipments[key]

    def refresh(self, slices: list[Slice]) -> None:
        if self._nodes is not None and self._nodes.done():
            try:
                self._apply(slices, self._nodes.result())
            except RayError as e:
                log.warning("ray: could not list the cluster's nodes: %s", _why(e))
            self._nodes = None
        if self._nodes is None and time.monotonic() >= self._next_refresh:
            self._next_refresh = time.monotonic() + REFRESH_SECONDS
            self._nodes = self._pool.submit(ray.nodes)

    def _apply(self, slices: list[Slice], nodes: list[dict[str, Any]]) -> None:
        """Per class, as many slices as live nodes advertise: a lost node's free ones go (busy
        ones once their workers are gone), a new node's are added."""
        want: Counter[str] = Counter()
        for _, kind, n in cluster_slices(nodes):
            want[kind] += n
        have = Counter(s.kind for s in slices)
        for kind in set(want) | set(have):
            extra = have[kind] - want[kind]
            gone = [s for s in slices if s.kind == kind and not s.busy][: max(0, extra)]
            for s in gone:
                slices.remove(s)
            for _ in range(-extra):
                slices.append(class_slice(kind, f"{kind}#{self._seq}"))
                self._seq += 1
            if gone or extra < 0:
                log.info("ray: %d slice(s) of class %s (a node joined or left)", want[kind], kind)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if ray.is_initialized():
            await asyncio.to_thread(ray.shutdown)
