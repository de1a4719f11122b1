"""`medusa materialize`: record a start-up twice, analyze it, write the artifact."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from medusa.child import exit_on_sigterm
from medusa.commands.options import (
    engine_choice,
    engine_options,
    refuse_reference_options,
)


# NOTE: long because click's signature is 13 lines; the body is a flat dispatch to _record_*.
@click.command(
    short_help="Record a start-up once and write an artifact.",
    context_settings={"show_default": True},
)
@click.argument("model", required=False)
@engine_choice(
    "medusa: the reference engine; vllm: a vLLM server (needs a GPU; arguments after -- "
    "go to vLLM)."
)
@engine_options
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Artifact directory (default: artifacts/<model>-<device>/).",
)
@click.option(
    "--command",
    "command",
    is_flag=True,
    help="Materialize any program instead: medusa materialize --command -- python x.py",
)
@click.option(
    "--skip-phase",
    "skip_phase",
    multiple=True,
    help="With --command: a phase (medusa.trace.mark) the program's own restore skips.",
)
@click.option(
    "--sign",
    metavar="KEYFILE",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="Sign the artifact with this ed25519 private key (medusa keygen makes one).",
)
@click.option(
    "--no-weights",
    "no_weights",
    is_flag=True,
    help="Do not write the weight store (the weights as they lie in device memory, which a "
    "restored start copies or, with --weights host, maps); restores then load the model file.",
)
@click.option(
    "--check-accesses",
    type=click.Choice(["warn", "strict"]),
    default=None,
    help="Record a third run with kernels' accesses traced (simcuda; slow) and check the "
    "pointer classification against them: warn on a disagreement, or (strict) refuse.",
)
@click.option(
    "--tensor-parallel-size",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    metavar="N",
    help="Record the model split over N devices, one process each (every rank recorded twice, "
    "at once); the artifact holds every rank's plan and weight store (its shard), and `medusa "
    "run --artifact` starts N ranks.",
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def materialize(
    model: str | None,
    engine_name: str,
    out: str | None,
    command: bool,
    skip_phase: tuple[str, ...],
    sign: str | None,
    no_weights: bool,
    check_accesses: str | None,
    argv: tuple[str, ...],
    **engine: object,
) -> None:
    """Record MODEL's start-up twice, analyze it, and write an artifact `medusa run --artifact`
    restores (KV size, CUDA graphs with relocated pointers, kernel identities)."""
    from medusa.artifact import sign_artifact
    from medusa.artifact.inspect import describe
    from medusa.artifact.seal import load_private_key
    from medusa.artifact.store import load_artifact
    from medusa.cuda.backend import NoDeviceError, load_backend
    from medusa.materialize.analysis import MaterializeError

    echo = lambda msg: click.echo(msg, err=True)  # noqa: E731
    exit_on_sigterm()  # NOTE: so that the scratch directories go with the process
    try:
        if sign:
            load_private_key(sign)  # a bad key file fails now, not after the recording
        kind = load_backend().kind
        if engine_name == "vllm":
            target, summary = _record_vllm(model, argv, out, kind, echo, engine)
        elif command:
            if engine["tensor_parallel_size"] != 1:
                raise click.UsageError("--tensor-parallel-size is the reference engine's: drop it "
                                       "with --command")  # fmt: skip
            target, summary = _record_command(
                model, argv, out, kind, echo, skip_phase, check_accesses
            )
        else:
            target, summary = _record_engine(
                model, argv, out, kind, echo, engine, no_weights, check_accesses
            )
        art = sign_artifact(target, sign) if sign else load_artifact(target)
    except (MaterializeError, ValueError, NoDeviceError) as e:  # ArtifactError is a ValueError
        raise click.ClickException(str(e)) from None
    except OSError as e:
        why = _os_error(e)
        if why is None:
            raise
        raise click.ClickException(why) from None
    click.echo(describe(art))
    _echo_summary(summary)


def _echo_summary(summary: dict[str, Any]) -> None:
    t = summary["timings"]
    click.echo(
        f"  size      {summary['bytes'] / 1024:.0f} KiB; stages: "
        + ", ".join(f"{k} {v:.2f}s" for k, v in t.items())
    )


def _record_vllm(
    model: str | None,
    argv: tuple[str, ...],
    out: str | None,
    kind: str,
    echo: Callable[[str], None],
    engine: dict[str, object],
) -> tuple[Path, dict[str, Any]]:
    """--engine vllm: MODEL and what follows -- are vLLM's own arguments."""
    from medusa.integrations.vllm.materialize import materialize_vllm

    refuse_reference_options(
        [*engine, "skip_phase", "command", "no_weights", "check_accesses"],
        "medusa materialize --engine vllm MODEL -- --max-model-len 4096",
    )
    vargs = [model, *argv] if model else list(argv)
    name = Path(vargs[0]).name if vargs else "model"
    target = Path(out or f"artifacts/vllm-{name}-{kind}")
    check_writable(target)
    return target, materialize_vllm(vargs, target, kind, echo)


def _record_command(
    model: str | None,
    argv: tuple[str, ...],
    out: str | None,
    kind: str,
    echo: Callable[[str], None],
    skip_phase: tuple[str, ...],
    check_accesses: str | None,
) -> tuple[Path, dict[str, Any]]:
    """--command: any program, MODEL being its first word."""
    from medusa.materialize.driver import materialize_command

    if check_accesses:
        raise click.UsageError(
            "--check-accesses replays the reference engine's graphs; a --command "
            "program has no such replay: drop --check-accesses"
        )
    argv_list = list(argv if not model else (model, *argv))
    if not argv_list:
        raise click.UsageError("--command needs a program: medusa materialize --command -- CMD")
    target = Path(out or f"artifacts/command-{kind}")
    check_writable(target)
    return target, materialize_command(argv_list, target, kind, echo, skip_phase)


def _record_engine(
    model: str | None,
    argv: tuple[str, ...],
    out: str | None,
    kind: str,
    echo: Callable[[str], None],
    engine: dict[str, object],
    no_weights: bool,
    check_accesses: str | None,
) -> tuple[Path, dict[str, Any]]:
    """The reference engine on MODEL (the bundled one when none is given)."""
    from medusa.engine.artifact_settings import engine_settings
    from medusa.engine.config import EngineConfig
    from medusa.engine.loader import locate_model
    from medusa.engine.materialize import materialize_engine

    if argv:
        raise click.UsageError(
            f"unexpected arguments {' '.join(argv)}: to materialize a program, pass "
            f"--command -- {' '.join(argv)}"
        )
    locate_model(model)
    config = EngineConfig(model=model, **engine_settings(engine))
    name = Path(model).stem if model else "smollm2"
    target = Path(out or f"artifacts/{name}-{kind}")
    check_writable(target)
    check = None
    if check_accesses:
        from medusa.tessera.record import pointer_check

        check = pointer_check(kind, strict=check_accesses == "strict")
    ranks = int(engine["tensor_parallel_size"])  # type: ignore[call-overload]
    if ranks > 1 and check:
        raise click.UsageError("--check-accesses records one device: drop it, or "
                               "--tensor-parallel-size")  # fmt: skip
    summary = materialize_engine(config, target, kind, echo, weights=not no_weights, check=check,
                                 ranks=ranks)  # fmt: skip
    return target, summary


def _os_error(e: OSError) -> str | None:
    """What to tell the user about a full disk or an unwritable --out; None for anything else."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return _no_space(e)
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR) and e.filename:
        return _cannot_write(e.filename, e.strerror or str(e))
    return None


def check_writable(out: Path) -> None:
    """--out where this user cannot make it: refused before the recording, naming the path
    (tried by making a directory there and removing it: permissions, a read-only or a special
    file system, a file in the way)."""
    where = out.absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise click.ClickException(_cannot_write(out, f"{where} is not a directory"))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".medusa-write-check-", dir=where))
    except OSError as e:
        raise click.ClickException(_cannot_write(out, f"{where}: {e.strerror or e}")) from None


def _cannot_write(out: str | Path, why: str) -> str:
    return f"--out {out}: cannot write there ({why}); pass --out a directory you can write"


def _no_space(e: OSError) -> str:
    """A full disk or quota: where, and how much was asked (the store's writer says it), with
    nothing left behind (every partial output is removed on the way out)."""
    if e.filename is None:  # our own message: the directory and the space needed
        return f"{e.strerror}; nothing was written"
    where = Path(e.filename).parent
    return (f"{where}: no space left on the device ({e.strerror}) while writing {e.filename}; "
            "free some space there (or write elsewhere: --out, TMPDIR) and materialize again; "
            "nothing was written")  # fmt: skip
