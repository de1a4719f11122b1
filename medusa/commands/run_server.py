"""How `medusa run` serves: the engine (restored from an artifact, or started the normal way)
behind the worker's API server, on its listener until stopped, or for one --demo answer; a pooled
worker's server (medusa.serve.pooled_server) until the gateway assigns it a model."""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from medusa import env, scratch

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from medusa.engine.config import EngineConfig
    from medusa.engine.llm_engine import LLMEngine
    from medusa.serve.async_engine import AsyncEngine, StageFn
    from medusa.serve.connections import ConnectionLimits
    from medusa.serve.listeners import Listener, Where


def reexec_under_recorder() -> None:
    """Restore maps allocations through the recorder in restore mode: this command again,
    under it (execve keeps the pid, and the scratch directory's lock)."""
    from medusa.child import medusa_cli
    from medusa.trace import recorder_env

    trace_dir = scratch.ScratchDir(scratch.RESTORE_TRACE, across_exec=True).path
    recorder = recorder_env(os.path.join(trace_dir, "restore-%p.mtr"), mode="restore")
    cmd = medusa_cli(*sys.argv[1:])
    os.execve(cmd[0], cmd, recorder)


def serve_pool(
    where: Where,
    limits: ConnectionLimits,
    given: bool,
    prepare: tuple[str, ...],
    max_request_bytes: int,
    prepare_artifacts: tuple[str, ...],
) -> None:
    """Waits in the gateway's warm pool, then serves what it assigns, until stopped."""
    from medusa.commands.run_inputs import fit_limits, open_listener
    from medusa.serve.pooled_server import serve_pooled

    try:
        serve_pooled(
            click.get_current_context().command, open_listener(where), fit_limits(limits, given),
            env.WORKER_TOKEN.get(), list(prepare), max_request_bytes, list(prepare_artifacts),
        )  # fmt: skip
    finally:
        scratch.remove_restore_trace()


def restored_engine(
    config: EngineConfig,
    artifact: str,
    require_artifact: bool,
    validate: bool,
    trust: str | None,
    partition: str | None,
    partition_timeout: float,
    on_stage: StageFn,
) -> LLMEngine:
    """The engine restored from `artifact` (on the engine thread), its decode graphs split by
    `partition` when given."""
    from medusa.engine.llm_engine import LLMEngine

    engine = LLMEngine(
        config,
        artifact=artifact,
        require_artifact=require_artifact,
        validate=validate,
        trust=trust,
        store_checked=env.STORE_CHECKED.get(),
        on_stage=on_stage,
    )
    if partition:
        from medusa.tessera.partition import Leader

        # NOTE: it replaces the graph replay
        Leader(engine, artifact, partition, partition_timeout)
    return engine


def serve(
    config: EngineConfig,
    model: str | None,
    where: Where,
    served_model_name: str | None,
    demo: str | None,
    artifact: str | None,
    require_artifact: bool,
    validate: bool,
    *,
    trust: str | None,
    max_request_bytes: int,
    limits: ConnectionLimits,
    partition: str | None = None,
    partition_timeout: float = 10.0,
    tensor_parallel_size: int = 1,
) -> None:
    """Serves on `where` until stopped (or answers `demo` and stops)."""
    from medusa.commands.run_inputs import open_listener
    from medusa.serve.api_server import create_app

    listener = None if demo is not None else open_listener(where)
    factory = None
    if artifact:
        factory = functools.partial(
            restored_engine, config, artifact, require_artifact, validate, trust, partition,
            partition_timeout,
        )  # fmt: skip
    if tensor_parallel_size > 1:
        from medusa.serve.tensor_parallel import TPLeader

        restore = {"artifact": artifact, "require_artifact": require_artifact,
                   "validate": validate, "trust": trust} if artifact else {}  # fmt: skip
        factory = functools.partial(TPLeader, config, tensor_parallel_size, **restore)
    async_engine = _start_engine(config, factory)
    name = served_model_name or model or "smollm2"
    app = create_app(async_engine, name, max_body_bytes=max_request_bytes)
    try:
        if require_artifact:
            async_engine.ready.wait()
            if async_engine.error:
                click.echo(f"medusa run: {async_engine.error}", err=True)
                raise SystemExit(3)
        if demo is not None:
            from medusa.serve.demo import run_demo

            raise SystemExit(run_demo(app, async_engine, where.host, where.port, name, demo))
        assert listener is not None
        _run_server(app, async_engine, listener, limits)
    finally:
        async_engine.shutdown()
        scratch.remove_restore_trace()
        if listener is not None:
            listener.close()


def _start_engine(
    config: EngineConfig, factory: Callable[[StageFn], LLMEngine] | None
) -> AsyncEngine:
    """The engine, starting on its own thread; the restore trace goes once it has started."""
    from medusa.serve.async_engine import AsyncEngine

    async_engine = AsyncEngine(config, factory)
    async_engine.start()
    threading.Thread(target=_remove_trace_when_started, args=(async_engine,), daemon=True).start()
    return async_engine


def _run_server(
    app: FastAPI, async_engine: AsyncEngine, listener: Listener, limits: ConnectionLimits
) -> None:
    """Serves `app` on `listener` until stopped, or until the engine fails to start."""
    from medusa.serve.connections import make_server
    from medusa.serve.listeners import describe

    server = make_server(app, limits, log_level="info")
    logging.getLogger("medusa.serve").info("listening on %s", describe(listener.socket))
    threading.Thread(target=_stop_if_failed, args=(async_engine, server), daemon=True).start()
    server.run(sockets=[listener.socket])
    if async_engine.error:
        click.echo(f"medusa run: the engine failed to start: {async_engine.error}", err=True)
        raise SystemExit(1)
    if not server.started:
        raise SystemExit(1)


def _stop_if_failed(async_engine: AsyncEngine, server: uvicorn.Server) -> None:
    async_engine.ready.wait()
    if async_engine.error:
        server.should_exit = True


def _remove_trace_when_started(async_engine: AsyncEngine) -> None:
    async_engine.ready.wait()
    scratch.remove_restore_trace()
