"""`medusa gateway`: a catalog of models scaled from zero onto slices."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from medusa.commands.options import (
    connection_limits,
    connection_options,
    max_request_bytes_option,
)

if TYPE_CHECKING:
    import socket

    from medusa.serve.connections import ConnectionLimits
    from medusa.serve.gateway.backends import WorkerBackend
    from medusa.serve.gateway.config import GatewayConfig
    from medusa.serve.gateway.slices import Slice

# Descriptors kept for what is not a client's connection: workers' sockets and pipes, their
# connections, artifacts and weight stores; each slice may hold a worker (and a pooled one).
RESERVED_FDS = 256
RESERVED_FDS_PER_SLICE = 32


@click.command(
    short_help="Serve a catalog of models, scaled from zero.",
    context_settings={"show_default": True},
)
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="models.yaml: the catalog (see runtime/models.yaml).",
)
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--port", default=9000, type=int, help="Port to listen on.")
@max_request_bytes_option
@connection_options
@click.option(
    "--cluster",
    default="local",
    help="Where workers run: local (processes here), ray (the Ray cluster RAY_ADDRESS names, or "
    "a new one on this machine) or ray://HOST:PORT (join the Ray cluster headed there; needs "
    "the [ray] extra).",
)
def gateway(
    config_path: str,
    host: str,
    port: int,
    max_request_bytes: int,
    max_connections: int,
    header_timeout: float,
    body_timeout: float,
    cluster: str,
) -> None:
    """Serve a catalog of models, each scaled from zero onto device slices, behind one
    OpenAI-compatible endpoint."""
    import logging

    from medusa.serve.connections import make_server
    from medusa.serve.gateway.app import create_gateway

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        limits, given = connection_limits(max_connections, header_timeout, body_timeout)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    config, backend, slices, limits, listener = _prepare(
        config_path, cluster, limits, given, host, port
    )
    click.echo(
        f"gateway: {len(config.models)} models, {len(slices)} slices "
        f"({', '.join(s.id for s in slices)})",
        err=True,
    )
    app = create_gateway(config, slices, max_body_bytes=max_request_bytes, backend=backend)
    # NOTE: no access log: a line per proxied request is a measurable share of its overhead.
    server = make_server(app, limits, log_level="info", access_log=False)
    try:
        server.run(sockets=[listener])
    finally:
        listener.close()


def _prepare(
    config_path: str, cluster: str, limits: ConnectionLimits, given: bool, host: str, port: int
) -> tuple[GatewayConfig, WorkerBackend, list[Slice], ConnectionLimits, socket.socket]:
    """The catalog, the back-end and its slices, checked (the models fit them), the connection
    limits the descriptors allow, and the bound listener: refused at once, with the reason."""
    from medusa.serve.connections import fit_descriptors
    from medusa.serve.gateway.backends import make_backend
    from medusa.serve.gateway.config import ConfigError, load_config
    from medusa.serve.gateway.placement import check_placement, plan_chunks
    from medusa.serve.listeners import bind_tcp

    try:
        config = load_config(config_path)
        backend = make_backend(cluster)
        backend.check(config)
        slices = backend.discover(config.slices)
        check_placement(config, slices)
        config = plan_chunks(config, slices)
        reserve = RESERVED_FDS + RESERVED_FDS_PER_SLICE * len(slices)
        limits = fit_descriptors(limits, per_connection=2, reserve=reserve, explicit=given)
        listener = bind_tcp(host, port)
    except (ConfigError, ValueError) as e:  # ListenError is one
        raise click.ClickException(str(e)) from None
    return config, backend, slices, limits, listener
