"""Options several commands share: the reference engine's settings, the engine choice, --trust."""

from __future__ import annotations

import click

from medusa.serve import MAX_BODY_BYTES


def engine_options(f):  # type: ignore[no-untyped-def]
    """The engine settings `run` and `materialize` share (they must match to restore)."""
    opts = [
        click.option(
            "--max-num-seqs", default=8, type=int, help="Sequences decoded together at most."
        ),
        click.option("--max-model-len", default=2048, type=int, help="Prompt + completion tokens."),
        click.option("--max-num-batched-tokens", default=512, type=int, help="Tokens in one step."),
        click.option(
            "--gpu-memory-utilization", default=0.9, type=float, help="Device memory fraction."
        ),
        click.option(
            "--kv-cache-memory",
            default=None,
            type=int,
            help="KV-cache bytes; skips the profiling pass.",
        ),
        click.option(
            "--kv-memory",
            type=click.Choice(["static", "elastic"]),
            default="static",
            help="elastic: reserve the KV range and map 2 MiB pages as requests need them, drawn "
            "from the device's page ledger (MEDUSA_KV_LEDGER) that workers sharing a device use; "
            "an idle model gives its pages back at once.",
        ),
        click.option("--enforce-eager", is_flag=True, help="Do not capture decode graphs."),
        click.option("--seed", default=0, type=int, help="Seed for requests that bring none."),
        click.option(
            "--max-prefill-chunk",
            default=None,
            type=int,
            help="Prefill long prompts in chunks of at most this many tokens.",
        ),
        click.option(
            "--weights",
            type=click.Choice(["device", "host"]),
            default="device",
            help="host: projection weights stay in host-mapped memory (HybridGEMM).",
        ),
        click.option(
            "--alpha",
            default=0.0,
            type=float,
            help="With --weights host: HybridGEMM's output-stationary share of columns.",
        ),
        click.option(
            "--tune-alpha",
            is_flag=True,
            help="With --weights host: tune alpha online (C2CServe Algorithm 2).",
        ),
        click.option(
            "--serve-while-loading/--no-serve-while-loading",
            default=None,
            help="Restoring with a weight store: be ready before the weights are all in; each "
            "layer of the first steps waits for its own weights (default: on a GPU, not on "
            "simcuda, where the copy and the forward pass share the CPU, and not with "
            "--require-artifact, which fails a bad store at start).",
        ),
        click.option(
            "--slice-profile",
            default="7g.96gb",
            help="The GH200 MIG profile alpha tuning models utilisation for.",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def engine_choice(help: str):  # type: ignore[no-untyped-def]
    """--engine medusa|vllm, as run and materialize take it."""
    return click.option(
        "--engine",
        "engine_name",
        type=click.Choice(["medusa", "vllm"]),
        default="medusa",
        help=help,
    )


def trust_option(f):  # type: ignore[no-untyped-def]
    return click.option(
        "--trust",
        metavar="PUBKEY",
        type=click.Path(dir_okay=False, exists=True),
        default=None,
        help="Public key file: refuse an artifact not signed by it (medusa keygen makes keys).",
    )(f)


# Both servers (a worker and the gateway) bound request bodies the same way.
max_request_bytes_option = click.option(
    "--max-request-bytes",
    default=MAX_BODY_BYTES,
    type=click.IntRange(min=1024),
    help="Larger request bodies get 413.",
)


def connection_options(f):  # type: ignore[no-untyped-def]
    """How many connections a server (a worker, the gateway) holds and how long a client may
    take to send a request (medusa.serve.connections); the defaults come from ConnectionLimits."""
    from medusa.serve.connections import ConnectionLimits

    d = ConnectionLimits()
    opts = [
        click.option(
            "--max-connections",
            default=d.max_connections,
            type=click.IntRange(min=1),
            help="Connections held at once (lowered to fit ulimit -n unless given). At the "
            "limit a new connection displaces the oldest one still waiting for its request; "
            "when all are busy it gets 503 with Retry-After.",
        ),
        click.option(
            "--header-timeout",
            default=d.header_timeout,
            type=click.FloatRange(min=0, min_open=True),
            help="Seconds a client has to send a request's line and headers (408 after).",
        ),
        click.option(
            "--body-timeout",
            default=d.body_timeout,
            type=click.FloatRange(min=0, min_open=True),
            help="Seconds a client has, from its headers, to send the request's body (408 after).",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def connection_limits(max_connections: int, header_timeout: float, body_timeout: float):  # type: ignore[no-untyped-def]
    """The ConnectionLimits of connection_options' values, and whether --max-connections was
    given on the command line (then it is not lowered to fit: too many is an error)."""
    from medusa.serve.connections import ConnectionLimits

    ctx = click.get_current_context()
    given = ctx.get_parameter_source("max_connections") == click.core.ParameterSource.COMMANDLINE
    return ConnectionLimits(max_connections, header_timeout, body_timeout), given


def refuse_reference_options(names: list[str], example: str) -> None:
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
