"""Where the gateway's workers run: a placement back-end starts `medusa run` for a slice and hands
back a worker it can address and stop. `local`: processes on this machine's slices. `ray`: Ray
actors on the nodes of a Ray cluster, which advertise their slices as custom resources.

The gateway decides (queueing, scale-from-zero, keep_alive, admission); a back-end only places
and supervises. Callers never branch on which one runs."""

from __future__ import annotations

from medusa.serve.gateway.backends.base import WorkerBackend
from medusa.serve.gateway.worker_handle import WorkerHandle

__all__ = ["WorkerBackend", "WorkerHandle", "make_backend"]


def make_backend(cluster: str) -> WorkerBackend:
    """`local`, `ray` (join the cluster RAY_ADDRESS names, or start one on this machine) or
    `ray://HOST:PORT` (join the cluster whose head, `ray start --head`, listens there)."""
    if cluster == "local":
        from medusa.serve.gateway.backends.local import LocalBackend

        return LocalBackend()
    if cluster == "ray" or cluster.startswith("ray://"):
        from medusa.serve.gateway.backends.ray import RayBackend

        return RayBackend(cluster.removeprefix("ray").removeprefix("://") or None)
    raise ValueError(
        f"--cluster {cluster!r}: expected 'local', 'ray' or 'ray://HOST:PORT' (the address of a "
        "Ray cluster's head)"
    )
