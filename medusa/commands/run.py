"""`medusa run`: serve a model (the reference engine or vLLM), restored from an artifact or
started the normal way, or wait in the gateway's warm pool."""

from __future__ import annotations

import click

from medusa import env as medusa_env
from medusa.child import exit_on_sigterm
from medusa.commands.options import (
    connection_limits,
    connection_options,
    engine_choice,
    engine_options,
    max_request_bytes_option,
    refuse_reference_options,
    trust_option,
)
from medusa.commands.run_inputs import (
    check_partition,
    check_pool_inputs,
    check_run_inputs,
    engine_config,
    fit_limits,
    group_size,
    setup_logging,
    where_to_listen,
)
from medusa.commands.run_server import reexec_under_recorder, serve, serve_pool
from medusa.commands.run_vllm import run_vllm


# NOTE: long because click's signature is 27 lines; the body is the start-up's checks in order.
@click.command(
    short_help="Serve a model with an OpenAI-compatible API.",
    context_settings={"show_default": True},
)
@click.argument("model", required=False)
@engine_choice(
    "medusa: the reference engine; vllm: `vllm serve` with the medusa plugin "
    "(arguments after -- go to vllm serve: medusa run --engine vllm MODEL -- --seed 3)."
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
    help="Restore start-up from this artifact (medusa materialize makes it). The artifact "
    "decides the model and the settings that shape its graphs (medusa inspect DIR prints them): "
    "none needs repeating, and one given with another value is refused.",
)
@click.option(
    "--require-artifact",
    is_flag=True,
    help="Exit with the reason instead of starting normally when the artifact is unusable.",
)
@click.option(
    "--allow-fallback",
    is_flag=True,
    help="With --artifact: use the MODEL and settings given even where the artifact was "
    "materialized with others, and start the normal way then (instead of refusing them).",
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
    "--tensor-parallel-size",
    type=click.IntRange(1, 8),
    default=None,
    metavar="N",
    help="Split the model over N devices, one process each (this one serves HTTP); a rank that "
    "dies or stops fails the engine (503, /health) within MEDUSA_NCCL_TIMEOUT seconds. "
    "Default: the --artifact's group size, else 1.",
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
    allow_fallback: bool,
    trust: str | None,
    validate: bool,
    partition: str | None,
    partition_timeout: float,
    tensor_parallel_size: int | None,
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

    die_with_parent()
    setup_logging(verbose, quiet=demo is not None)
    if engine_name == "vllm":
        refuse_reference_options(
            [*engine, "served_model_name", "demo", "validate", "uds", "fd", "max_connections",
             "header_timeout", "body_timeout", "allow_fallback", "tensor_parallel_size"],
            "medusa run --engine vllm --artifact DIR -- --seed 3",
        )  # fmt: skip
        run_vllm(model, artifact, list(argv), host, port, require_artifact, trust)
    if argv:
        raise click.UsageError(
            f"unexpected arguments {' '.join(argv)}: only --engine vllm takes arguments (after --)"
        )
    tensor_parallel_size = group_size(tensor_parallel_size, artifact, trust, allow_fallback)
    if tensor_parallel_size > 1 and (pool or partition):
        raise click.UsageError(
            "--tensor-parallel-size (or a tensor-parallel --artifact) does not combine with "
            "--pool or --partition yet"
        )
    if pool:
        check_pool_inputs(model, artifact, prepare)
    config = engine_config(model, artifact, trust, engine, allow_fallback, require_artifact)
    try:
        limits, given = connection_limits(max_connections, header_timeout, body_timeout)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    check_run_inputs(config.model, artifact)
    where = where_to_listen(host, port, uds, fd, demo)
    check_partition(partition, artifact, pool)
    if (artifact or pool) and not medusa_env.TRACE.get():
        reexec_under_recorder()
    exit_on_sigterm()  # NOTE: so that what this process made in /tmp goes with it
    from medusa import plugins

    plugins.register()  # the research systems an engine's config may name, for every engine here
    if pool:
        serve_pool(where, limits, given, prepare, max_request_bytes, prepare_artifacts)
        return
    serve(
        config, config.model, where, served_model_name, demo, artifact,
        require_artifact, validate, trust=trust, max_request_bytes=max_request_bytes,
        partition=partition, partition_timeout=partition_timeout, limits=fit_limits(limits, given),
        tensor_parallel_size=tensor_parallel_size,
    )  # fmt: skip
