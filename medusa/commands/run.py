"""`medusa run`: serve a model (the reference engine or vLLM), restored from an artifact or
started the normal way, or wait in the gateway's warm pool."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from medusa import env as medusa_env
from medusa import scratch
from medusa.child import exit_on_sigterm
from medusa.commands.options import (
    connection_limits,
    connection_options,
    engine_choice,
    engine_options,
    max_request_bytes_option,
    trust_option,
)

if TYPE_CHECKING:
    from medusa.engine.config import EngineConfig
    from medusa.serve.connections import ConnectionLimits
    from medusa.serve.listeners import Listener, Where


@click.command(
    short_help="Serve a model with an OpenAI-compatible API.",
    context_settings={"show_default": True, "ignore_unknown_options": True},
)
@click.argument("model", required=False)
@engine_choice(
    "medusa: the reference engine; vllm: `vllm serve` with the medusa plugin "
    "(arguments after -- go to vllm serve)."
)
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--port", default=8000, type=int, help="Port to listen on.")
@click.option(
    "--uds",
    metavar="PATH",
    default=None,
    help="Listen on a Unix socket made at PATH instead of --host/--port: created by this "
    "command (PATH must not exist), mode 0600, removed when it stops.",
)
@click.option(
    "--fd",
    type=click.IntRange(min=3),
    default=None,
    help="Listen on the listening socket inherited as descriptor FD instead (how the gateway "
    "starts its workers: it binds each one's socket itself, so nobody else can take it).",
)
@connection_options
@click.option("--served-model-name", default=None, help="Model id clients send (default: MODEL).")
@engine_options
@click.option(
    "--artifact",
    type=click.Path(file_okay=False),
    default=None,
    help="Restore start-up from this artifact (medusa materialize makes it).",
)
@click.option(
    "--require-artifact",
    is_flag=True,
    help="Exit with the reason instead of starting normally when the artifact is unusable.",
)
@trust_option
@click.option(
    "--validate",
    is_flag=True,
    help="Replay each restored graph once on a probe input and compare with eager.",
)
@click.option(
    "--partition",
    metavar="PLAN",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --artifact: decode graphs split across this process and a second simcuda "
    "process by PLAN (medusa tessera place makes it).",
)
@click.option(
    "--partition-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="With --partition: how long the second process may take to answer within a decode "
    "step; past it the engine fails (503, /health) instead of waiting.",
)
@click.option(
    "--demo",
    metavar="PROMPT",
    default=None,
    help="Serve, answer PROMPT over HTTP, print the answer and stop.",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="Log start-up stages and failures' tracebacks to stderr."
)
@max_request_bytes_option
@click.option(
    "--pool",
    is_flag=True,
    help="Warm up without a model and wait for the gateway to assign one (its warm pool).",
)
@click.option(
    "--prepare",
    multiple=True,
    metavar="MODEL",
    help="With --pool: open MODEL's file and tokenizer ahead (repeatable).",
)
@click.option(
    "--prepare-artifact",
    "prepare_artifacts",
    multiple=True,
    metavar="DIR",
    help="With --pool: check the artifact DIR and open its weight store ahead, so an assignment "
    "of it restores without reading either again (repeatable).",
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def run(
    model: str | None,
    engine_name: str,
    argv: tuple[str, ...],
    host: str,
    port: int,
    uds: str | None,
    fd: int | None,
    max_connections: int,
    header_timeout: float,
    body_timeout: float,
    served_model_name: str | None,
    demo: str | None,
    artifact: str | None,
    require_artifact: bool,
    trust: str | None,
    validate: bool,
    partition: str | None,
    partition_timeout: float,
    verbose: bool,
    max_request_bytes: int,
    pool: bool,
    prepare: tuple[str, ...],
    prepare_artifacts: tuple[str, ...],
    **engine: object,
) -> None:
    """Serve MODEL (default: SmolLM2-135M-Instruct) with an OpenAI-compatible API.

    MODEL is 'smollm2', a .gguf file, or a Hugging Face-layout directory. The server answers
    /health with 503 until the engine has started; requests made meanwhile wait. A model that
    cannot load, a missing --artifact directory or a busy port end the command at once with the
    reason (an artifact that exists but does not fit falls back to a normal start).
    """
    from medusa.child import die_with_parent
    from medusa.engine.config import EngineConfig

    die_with_parent()
    _setup_logging(verbose, quiet=demo is not None)
    if engine_name == "vllm":
        _refuse_reference_options(
            [*engine, "served_model_name", "demo", "validate", "uds", "fd", "max_connections",
             "header_timeout", "body_timeout"],
            "medusa run --engine vllm --artifact DIR -- --seed 3",
        )  # fmt: skip
        _run_vllm(model, artifact, list(argv), host, port, require_artifact, trust)
    if argv:
        raise click.UsageError(
            f"unexpected arguments {' '.join(argv)} (only --engine vllm takes them)"
        )
    if pool:
        _check_pool_inputs(model, artifact, prepare)
    try:
        config = EngineConfig(model=model, **engine)  # type: ignore[arg-type]
        limits, given = connection_limits(max_connections, header_timeout, body_timeout)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    _check_run_inputs(model, artifact)
    where = _where(host, port, uds, fd, demo)
    if partition and (not artifact or pool or not Path(partition).is_file()):
        raise click.UsageError(
            f"--partition {partition}: " + ("no such file; make it with `medusa tessera place "
            f"ARTIFACT --out {partition}`" if artifact and not pool else "needs --artifact "
            "(the artifact PLAN was made for), and no --pool")
        )  # fmt: skip
    if (artifact or pool) and not medusa_env.TRACE.get():
        # Restore maps allocations through the recorder in restore mode: re-exec under it.
        from medusa.child import medusa_cli
        from medusa.trace import recorder_env

        # NOTE: execve keeps the pid, and the directory's lock
        trace_dir = scratch.ScratchDir(scratch.RESTORE_TRACE, across_exec=True).path
        env = recorder_env(os.path.join(trace_dir, "restore-%p.mtr"), mode="restore")
        cmd = medusa_cli(*sys.argv[1:])
        os.execve(cmd[0], cmd, env)
    exit_on_sigterm()  # NOTE: so that what this process made in /tmp goes with it
    from medusa import plugins

    plugins.register()  # the research systems an engine's config may name, for every engine here
    if pool:
        from medusa.serve.pool_worker import serve_pooled

        try:
            serve_pooled(
                click.get_current_context().command, _open(where),
                _fit(limits, given), medusa_env.WORKER_TOKEN.get(), list(prepare),
                max_request_bytes, list(prepare_artifacts),
            )  # fmt: skip
        finally:
            scratch.remove_restore_trace()
        return
    _serve(
        config, model, where, served_model_name, demo, artifact,
        require_artifact, validate, trust=trust, max_request_bytes=max_request_bytes,
        partition=partition, partition_timeout=partition_timeout, limits=_fit(limits, given),
    )  # fmt: skip


def _check_pool_inputs(model: str | None, artifact: str | None, prepare: tuple[str, ...]) -> None:
    """A pooled worker gets its model from the gateway, on a route guarded by the worker token."""
    from medusa import env
    from medusa.engine.loader import ModelError, locate_model

    if model or artifact:
        raise click.UsageError("--pool takes no MODEL or --artifact: the gateway assigns them")
    if not env.WORKER_TOKEN.get():
        raise click.UsageError(
            f"--pool needs {env.WORKER_TOKEN.name}: only the gateway that set it may assign a model"
        )
    for m in prepare:
        try:
            locate_model(m)
        except ModelError as e:
            raise click.ClickException(f"--prepare {e}") from None


def _setup_logging(verbose: bool, quiet: bool) -> None:
    """INFO by default; WARNING for --demo (its output is the answer); DEBUG with --verbose;
    MEDUSA_LOG_LEVEL over all of them."""
    import logging

    from medusa import env

    level = env.LOG_LEVEL.get().upper() or ("DEBUG" if verbose else "WARNING" if quiet else "INFO")
    if not isinstance(logging.getLevelName(level), int):
        raise click.UsageError(
            f"MEDUSA_LOG_LEVEL={level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    if level != "DEBUG":
        # NOTE: httpx logs a line per request at INFO (the demo polls /health).
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLevelName(level)))


def _check_run_inputs(model: str | None, artifact: str | None) -> None:
    """What would otherwise surface only after a slow start: refuse it now, with the fix."""
    from medusa.cuda.backend import NoDeviceError, load_backend
    from medusa.engine.loader import ModelError, locate_model

    try:
        locate_model(model)
    except ModelError as e:
        raise click.ClickException(str(e)) from None
    if artifact and not Path(artifact).is_dir():
        make = " ".join(["medusa materialize", *([model] if model else []), "--out", artifact])
        raise click.ClickException(
            f"--artifact {artifact}: no such directory; make it with `{make}`, or drop --artifact"
        )
    try:
        load_backend()
    except (NoDeviceError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None


def _where(host: str, port: int, uds: str | None, fd: int | None, demo: str | None) -> Where:
    """Where to listen, checked before a slow start: refused now, with the fix. The socket
    itself is made once the engine starts."""
    from medusa.serve.listeners import ListenError, Where

    if (uds or fd is not None) and demo is not None:
        raise click.UsageError("--demo listens on --host/--port: drop --uds/--fd")
    where = Where(host, port, uds, fd)
    try:
        where.check()
    except ListenError as e:
        raise click.ClickException(str(e)) from None
    return where


def _open(where: Where) -> Listener:
    from medusa.serve.listeners import ListenError

    try:
        return where.open()
    except ListenError as e:
        raise click.ClickException(str(e)) from None


def _fit(limits: ConnectionLimits, given: bool) -> ConnectionLimits:
    from medusa.serve.connections import fit_descriptors

    try:
        return fit_descriptors(limits, per_connection=1, reserve=256, explicit=given)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _serve(
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
) -> None:
    """Serves on `where` until stopped."""
    import threading

    from medusa.serve.async_engine import AsyncEngine
    from medusa.serve.connections import make_server
    from medusa.serve.listeners import describe
    from medusa.serve.worker import create_app

    listener = None if demo is not None else _open(where)

    factory = None
    if artifact:
        from medusa import env
        from medusa.engine.llm_engine import LLMEngine

        def factory() -> LLMEngine:
            engine = LLMEngine(
                config,
                artifact=artifact,
                require_artifact=require_artifact,
                validate=validate,
                trust=trust,
                store_checked=env.STORE_CHECKED.get(),
            )
            if partition:
                from medusa.tessera.partition import Leader

                # NOTE: it replaces the graph replay
                Leader(engine, artifact, partition, partition_timeout)
            return engine

    async_engine = AsyncEngine(config, factory)
    async_engine.start()
    threading.Thread(target=_remove_trace_when_started, args=(async_engine,), daemon=True).start()
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
        server = make_server(app, limits, log_level="info")
        logging.getLogger("medusa.serve").info("listening on %s", describe(listener.socket))

        def stop_if_failed() -> None:
            async_engine.ready.wait()
            if async_engine.error:
                server.should_exit = True

        threading.Thread(target=stop_if_failed, daemon=True).start()
        server.run(sockets=[listener.socket])
        if async_engine.error:
            click.echo(f"medusa run: the engine failed to start: {async_engine.error}", err=True)
            raise SystemExit(1)
        if not server.started:
            raise SystemExit(1)
    finally:
        async_engine.shutdown()
        scratch.remove_restore_trace()
        if listener is not None:
            listener.close()


def _remove_trace_when_started(engine: Any) -> None:
    engine.ready.wait()
    scratch.remove_restore_trace()


def _refuse_reference_options(names: list[str], example: str) -> None:
    """With --engine vllm, options of the reference engine given on the command line would be
    silently dropped: name them and say where vLLM's own go."""
    ctx = click.get_current_context()
    given = [
        "--" + name.replace("_", "-")
        for name in names
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        raise click.UsageError(
            f"{', '.join(given)}: the reference engine's option(s); with --engine vllm pass "
            f"vLLM's own after --, e.g. {example}"
        )


def _run_vllm(
    model: str | None,
    artifact: str | None,
    argv: list[str],
    host: str,
    port: int,
    require: bool,
    trust: str | None,
) -> None:
    from medusa.artifact import ArtifactError
    from medusa.integrations.vllm.serve import serve_command

    try:
        cmd, env = serve_command(artifact, model, argv, host, port, require, trust)
    except ArtifactError as e:
        raise click.ClickException(str(e)) from None
    click.echo("medusa run: " + " ".join(cmd), err=True)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        raise click.ClickException(
            f"cannot start vLLM ({e}): install it with pip install 'medusa-coldstart[vllm]'"
        ) from None
