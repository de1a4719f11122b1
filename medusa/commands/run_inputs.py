"""What `medusa run` checks before a slow start, refused at once with the fix: the log level, the
model and artifact, the partition plan, the pool's inputs, where to listen and how many
connections the descriptors allow."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from medusa import env

if TYPE_CHECKING:
    from medusa.engine.config import EngineConfig
    from medusa.serve.connections import ConnectionLimits
    from medusa.serve.listeners import Listener, Where


def setup_logging(verbose: bool, quiet: bool) -> None:
    """INFO by default; WARNING for --demo (its output is the answer); DEBUG with --verbose;
    MEDUSA_LOG_LEVEL over all of them."""
    level = env.LOG_LEVEL.get().upper() or ("DEBUG" if verbose else "WARNING" if quiet else "INFO")
    if not isinstance(logging.getLevelName(level), int):
        raise click.UsageError(
            f"MEDUSA_LOG_LEVEL={level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    if level != "DEBUG":
        # NOTE: httpx logs a line per request at INFO (the demo polls /health).
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLevelName(level)))


def check_pool_inputs(model: str | None, artifact: str | None, prepare: tuple[str, ...]) -> None:
    """A pooled worker gets its model from the gateway, on a route guarded by the worker token."""
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


def engine_config(
    model: str | None,
    artifact: str | None,
    trust: str | None,
    options: dict[str, object],
    allow_fallback: bool,
    require_artifact: bool,
) -> EngineConfig:
    """The engine's settings: with --artifact, the model and the graphs' settings are the
    artifact's (a flag given with another value is refused, unless --allow-fallback)."""
    from medusa.commands.options import engine_option_name, given_on_command_line
    from medusa.engine.artifact_settings import (
        ArtifactSettings,
        SettingConflict,
        Wording,
        engine_settings,
        resolve,
    )
    from medusa.engine.config import EngineConfig
    from medusa.engine.loader import ModelError

    if allow_fallback and (require_artifact or not artifact):
        raise click.UsageError(
            "--allow-fallback: needs --artifact, and no --require-artifact (which exits instead "
            "of starting the normal way): drop one"
        )
    settings = engine_settings(options)
    explicit = given_on_command_line(click.get_current_context(), settings)
    art = ArtifactSettings.read(artifact, trust) if artifact else None
    try:
        words = Wording(engine_option_name, "MODEL", "--allow-fallback")
        model, settings = resolve(art, model, settings, explicit, words, allow_fallback)
        return EngineConfig(model=model, **settings)
    except SettingConflict as e:
        raise click.UsageError(str(e)) from None
    except ModelError as e:
        raise click.ClickException(str(e)) from None
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def check_run_inputs(model: str | None, artifact: str | None) -> None:
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


def check_partition(partition: str | None, artifact: str | None, pool: bool) -> None:
    """--partition PLAN splits a restored artifact's decode graphs: it needs the artifact."""
    if partition and (not artifact or pool or not Path(partition).is_file()):
        raise click.UsageError(
            f"--partition {partition}: " + ("no such file; make it with `medusa tessera place "
            f"ARTIFACT --out {partition}`" if artifact and not pool else "needs --artifact "
            "(the artifact PLAN was made for), and no --pool")
        )  # fmt: skip


def group_size(given: int | None, artifact: str | None, trust: str | None, fallback: bool) -> int:
    """The tensor-parallel group's size: --tensor-parallel-size, else the --artifact's (1 for
    one device). Another size than the artifact's is refused (with --allow-fallback: started
    that way, the normal way)."""
    from medusa.artifact import ArtifactError, read_manifest

    recorded = None  # NOTE: an artifact that cannot be read: the start refuses it, with why
    if artifact:
        try:
            tp = read_manifest(Path(artifact), trust).get("tensor_parallel")
            recorded = tp["size"] if tp else 1
        except (ArtifactError, OSError):
            pass
    if given is None:
        return recorded or 1
    if recorded is None or given == recorded or fallback:
        return given
    raise click.UsageError(
        f"--tensor-parallel-size {given}: the artifact {artifact} was materialized for "
        + (f"a tensor-parallel group of {recorded}" if recorded > 1 else "one device")
        + f"; drop the flag (or pass {recorded}), or materialize again with "
        f"--tensor-parallel-size {given}"
    )


def where_to_listen(
    host: str, port: int, uds: str | None, fd: int | None, demo: str | None
) -> Where:
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


def open_listener(where: Where) -> Listener:
    from medusa.serve.listeners import ListenError

    try:
        return where.open()
    except ListenError as e:
        raise click.ClickException(str(e)) from None


def fit_limits(limits: ConnectionLimits, given: bool) -> ConnectionLimits:
    """The connection limits this process's descriptors allow (refused if given and too many)."""
    from medusa.serve.connections import fit_descriptors

    try:
        return fit_descriptors(limits, per_connection=1, reserve=256, explicit=given)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
