"""Options several commands share: the reference engine's settings, the engine choice, --trust."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable
from typing import Any

import click

from medusa.serve import MAX_BODY_BYTES


class _Sizes(click.ParamType):
    """Comma-separated positive integers: `--capture-sizes 1,2,4`."""

    name = "N,N,..."

    def __init__(self, empty: bool = False) -> None:
        self.empty = empty  # '' gives () (prefill_graph_sizes: none)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        try:
            sizes = tuple(int(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            self.fail(f"{value!r}: give batch sizes separated by commas, e.g. 1,2,4", param, ctx)
        if not sizes and self.empty:
            return ()
        if not sizes or min(sizes) < 1:
            self.fail(f"{value!r}: give batch sizes of at least 1, e.g. 1,2,4", param, ctx)
        return sizes


def engine_option_name(name: str) -> str:
    """The command-line flag of an EngineConfig field: max_num_seqs -> --max-num-seqs."""
    return "--" + name.replace("_", "-")


def _engine_option(f: dataclasses.Field[Any], kind: Any) -> Callable[[Any], Any]:
    flag, help, default = engine_option_name(f.name), f.metadata["help"], f.default
    if kind is bool:
        return click.option(flag, is_flag=True, default=default, help=help)
    if kind == bool | None:
        no = flag.replace("--", "--no-", 1)
        return click.option(f"{flag}/{no}", default=None, help=help, show_default=False)
    choices = f.metadata.get("choices")
    if choices:
        return click.option(flag, type=click.Choice(choices), default=default, help=help)
    if kind in (tuple[int, ...], tuple[int, ...] | None):
        sizes = _Sizes(empty=f.metadata.get("empty", False))
        return click.option(flag, type=sizes, default=None, help=help, show_default=False)
    base = {int: int, float: float, str: str, int | None: int, float | None: float}[kind]
    return click.option(flag, type=base, default=default, help=help)


def engine_options(f):  # type: ignore[no-untyped-def]
    """The engine's settings as options, one per EngineConfig field (MODEL is an argument):
    `run` and `materialize` share them (they must match to restore)."""
    from medusa.engine.config import EngineConfig

    kinds = typing.get_type_hints(EngineConfig)
    for field in reversed(dataclasses.fields(EngineConfig)):
        if field.name != "model":
            f = _engine_option(field, kinds[field.name])(f)
    return f


def given_on_command_line(ctx: click.Context, names: Iterable[str]) -> set[str]:
    """The parameters among `names` the user set (not left at their default)."""
    explicit = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return {n for n in names if ctx.get_parameter_source(n) in explicit}


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
