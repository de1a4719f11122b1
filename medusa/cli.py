"""The `medusa` command line. Commands are thin: they parse, call the package, print."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from medusa import __version__
from medusa.serve import MAX_BODY_BYTES
from medusa.tessera.command import tessera  # cheap: it imports its work where used

if TYPE_CHECKING:
    from medusa.engine.config import EngineConfig

RESTORE_TRACE_PREFIX = "medusa-restore-"


class _InOrder(click.Group):
    """Lists commands in the order they are defined (the order a user needs them), not A-Z."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


@click.group(cls=_InOrder, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="medusa")
def main() -> None:
    """Medusa: materialize an LLM server's start-up once, restore it at every cold start.

    \b
    In the order you use them:
      1. medusa doctor                        check the back-end (simcuda or a GPU)
      2. medusa run [MODEL]                   serve a model, started the normal way
      3. medusa materialize [MODEL]           record its start-up once: an artifact
      4. medusa run --artifact DIR            cold-start from the artifact
      5. medusa gateway --config models.yaml  scale many models from zero

    `medusa COMMAND --help` explains each.
    """


@main.command(short_help="Check the back-end and the device; run a kernel.")
@click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "sim"]),
    default=None,
    help="Back-end to check (default: MEDUSA_DEVICE, else auto).",
)
def doctor(device: str | None) -> None:
    """Print the back-end in use, its libraries and versions, and the device; run a kernel."""
    from medusa.doctor import run_doctor

    raise SystemExit(run_doctor(device))


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


@main.command(
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
    "--demo",
    metavar="PROMPT",
    default=None,
    help="Serve, answer PROMPT over HTTP, print the answer and stop.",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="Log start-up stages and failures' tracebacks to stderr."
)
@click.option(
    "--max-request-bytes",
    default=MAX_BODY_BYTES,
    type=click.IntRange(min=1024),
    help="Larger request bodies get 413.",
)
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
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def run(
    model: str | None,
    engine_name: str,
    argv: tuple[str, ...],
    host: str,
    port: int,
    served_model_name: str | None,
    demo: str | None,
    artifact: str | None,
    require_artifact: bool,
    trust: str | None,
    validate: bool,
    verbose: bool,
    max_request_bytes: int,
    pool: bool,
    prepare: tuple[str, ...],
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
            [*engine, "served_model_name", "demo", "validate"],
            "medusa run --engine vllm --artifact DIR -- --seed 3",
        )
        _run_vllm(model, artifact, list(argv), host, port, require_artifact, trust)
    if argv:
        raise click.UsageError(
            f"unexpected arguments {' '.join(argv)} (only --engine vllm takes them)"
        )
    if pool:
        _check_pool_inputs(model, artifact, prepare)
    try:
        config = EngineConfig(model=model, **engine)  # type: ignore[arg-type]
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    _check_run_inputs(model, artifact, host, port)
    if (artifact or pool) and not os.environ.get("MEDUSA_TRACE"):
        # Restore maps allocations through the recorder in restore mode: re-exec under it.
        from medusa.child import medusa_cli
        from medusa.trace import recorder_env

        trace_dir = tempfile.mkdtemp(prefix=RESTORE_TRACE_PREFIX)
        env = recorder_env(os.path.join(trace_dir, "restore-%p.mtr"), mode="restore")
        cmd = medusa_cli(*sys.argv[1:])
        os.execve(cmd[0], cmd, env)
    if pool:
        from medusa import env as medusa_env
        from medusa.serve.pool_worker import serve_pooled

        try:
            serve_pooled(
                click.get_current_context().command, host, port, medusa_env.WORKER_TOKEN.get(),
                list(prepare), max_request_bytes,
            )  # fmt: skip
        finally:
            _remove_restore_trace()
        return
    _serve(
        config, model, host, port, served_model_name, demo, artifact, require_artifact, validate,
        trust=trust, max_request_bytes=max_request_bytes,
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


def _check_run_inputs(model: str | None, artifact: str | None, host: str, port: int) -> None:
    """What would otherwise surface only after a slow start, or never (another server answering
    on the port): refuse it now, with the fix."""
    import errno
    import socket

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
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise click.ClickException(f"port {port} is in use; pass --port") from None
            raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror}") from None


def _serve(
    config: EngineConfig,
    model: str | None,
    host: str,
    port: int,
    served_model_name: str | None,
    demo: str | None,
    artifact: str | None,
    require_artifact: bool,
    validate: bool,
    *,
    trust: str | None,
    max_request_bytes: int,
) -> None:
    import threading

    import uvicorn

    from medusa.serve.async_engine import AsyncEngine
    from medusa.serve.worker import create_app

    factory = None
    if artifact:
        from medusa.engine.llm_engine import LLMEngine

        def factory() -> LLMEngine:
            return LLMEngine(
                config,
                artifact=artifact,
                require_artifact=require_artifact,
                validate=validate,
                trust=trust,
            )

    async_engine = AsyncEngine(config, factory)
    async_engine.start()
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

            raise SystemExit(run_demo(app, async_engine, host, port, name, demo))
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info"))

        def stop_if_failed() -> None:
            async_engine.ready.wait()
            if async_engine.error:
                server.should_exit = True

        threading.Thread(target=stop_if_failed, daemon=True).start()
        server.run()
        if async_engine.error:
            click.echo(f"medusa run: the engine failed to start: {async_engine.error}", err=True)
            raise SystemExit(1)
        if not server.started:
            raise SystemExit(1)
    finally:
        async_engine.shutdown()
        _remove_restore_trace()


def _remove_restore_trace() -> None:
    """The restore-mode trace `run --artifact` re-executed itself under is read during start-up
    only; its directory goes when the server stops."""
    import shutil

    from medusa import env

    trace = env.TRACE.get()
    if trace and Path(trace).parent.name.startswith(RESTORE_TRACE_PREFIX):
        shutil.rmtree(Path(trace).parent, ignore_errors=True)


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


@main.command(
    short_help="Record a start-up once and write an artifact.",
    context_settings={"show_default": True, "ignore_unknown_options": True},
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
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def materialize(
    model: str | None,
    engine_name: str,
    out: str | None,
    command: bool,
    skip_phase: tuple[str, ...],
    sign: str | None,
    no_weights: bool,
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
    from medusa.engine.config import EngineConfig
    from medusa.engine.loader import locate_model
    from medusa.materialize.analysis import MaterializeError
    from medusa.materialize.driver import materialize_command, materialize_engine

    echo = lambda msg: click.echo(msg, err=True)  # noqa: E731
    try:
        if sign:
            load_private_key(sign)  # a bad key file fails now, not after the recording
        kind = load_backend().kind
        if engine_name == "vllm":
            from medusa.integrations.vllm.materialize import materialize_vllm

            _refuse_reference_options(
                [*engine, "skip_phase", "command", "no_weights"],
                "medusa materialize --engine vllm MODEL -- --max-model-len 4096",
            )
            vargs = [model, *argv] if model else list(argv)
            name = Path(vargs[0]).name if vargs else "model"
            target = Path(out or f"artifacts/vllm-{name}-{kind}")
            summary = materialize_vllm(vargs, target, kind, echo)
        elif command:
            argv_list = list(argv if not model else (model, *argv))
            if not argv_list:
                raise click.UsageError(
                    "--command needs a program: medusa materialize --command -- CMD"
                )
            target = Path(out or f"artifacts/command-{kind}")
            summary = materialize_command(argv_list, target, kind, echo, skip_phase)
        else:
            if argv:
                raise click.UsageError(
                    f"unexpected arguments {' '.join(argv)} (did you mean --command?)"
                )
            locate_model(model)
            config = EngineConfig(model=model, **engine)  # type: ignore[arg-type]
            name = Path(model).stem if model else "smollm2"
            target = Path(out or f"artifacts/{name}-{kind}")
            summary = materialize_engine(config, target, kind, echo, weights=not no_weights)
        art = sign_artifact(target, sign) if sign else load_artifact(target)
    except (MaterializeError, ValueError, NoDeviceError) as e:  # ArtifactError is a ValueError
        raise click.ClickException(str(e)) from None
    click.echo(describe(art))
    t = summary["timings"]
    click.echo(
        f"  size      {summary['bytes'] / 1024:.0f} KiB; stages: "
        + ", ".join(f"{k} {v:.2f}s" for k, v in t.items())
    )


@main.command(
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
@click.option(
    "--max-request-bytes",
    default=MAX_BODY_BYTES,
    type=click.IntRange(min=1024),
    help="Larger request bodies get 413.",
)
@click.option(
    "--cluster",
    default="local",
    help="Where workers run: local (processes here), ray (the Ray cluster RAY_ADDRESS names, or "
    "a new one on this machine) or ray://HOST:PORT (join the Ray cluster headed there; needs "
    "the [ray] extra).",
)
def gateway(config_path: str, host: str, port: int, max_request_bytes: int, cluster: str) -> None:
    """Serve a catalog of models, each scaled from zero onto device slices, behind one
    OpenAI-compatible endpoint."""
    import logging

    import uvicorn

    from medusa.serve.gateway.app import create_gateway
    from medusa.serve.gateway.backends import make_backend
    from medusa.serve.gateway.config import ConfigError, load_config
    from medusa.serve.gateway.placement import check_placement, plan_chunks

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = load_config(config_path)
        backend = make_backend(cluster)
        backend.check(config)
        slices = backend.discover(config.slices)
        check_placement(config, slices)
        config = plan_chunks(config, slices)
    except (ConfigError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(
        f"gateway: {len(config.models)} models, {len(slices)} slices "
        f"({', '.join(s.id for s in slices)})",
        err=True,
    )
    # NOTE: no access log: a line per proxied request is a measurable share of its overhead.
    uvicorn.run(
        create_gateway(config, slices, max_body_bytes=max_request_bytes, backend=backend),
        host=host,
        port=port,
        log_level="info",
        access_log=False,
    )


@main.command(
    short_help="Simulate models sharing a superchip's C2C link.",
    context_settings={"show_default": True},
)
@click.option(
    "--trace",
    "trace_kind",
    default="gamma",
    help="gamma (bursts), poisson, or an Azure LLM trace CSV file.",
)
@click.option("--duration", type=float, help="Seconds of trace (default 60; --sharing: 300).")
@click.option("--rate", default=1.0, help="Requests per second (synthetic traces).")
@click.option("--cv", default=3.0, help="Burstiness of the gamma trace (coefficient of variation).")
@click.option(
    "--slices",
    default="1g.12gb,1g.12gb,1g.12gb,1g.12gb,1g.24gb,2g.24gb,3g.48gb",
    help="GH200 MIG profiles, comma separated.",
)
@click.option("--placement", type=click.Choice(["bandwidth", "random"]), default="bandwidth")
@click.option("--chunk", type=click.Choice(["tuned", "default"]), default="tuned")
@click.option("--alpha", type=click.Choice(["tuned", "static"]), default="tuned")
@click.option("--seed", default=0)
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.option(
    "--sharing",
    is_flag=True,
    help="Instead: many models sharing devices, Prism vs static partitioning vs MuxServe-like "
    "(max load at 99%% TTFT attainment, devices needed). Uses --models, --devices, --duration "
    "and --seed.",
)
@click.option("--models", "n_models", default=16, help="--sharing: models in the catalog.")
@click.option("--devices", "n_devices", default=8, help="--sharing: 80 GiB devices.")
@click.option(
    "--weaving",
    is_flag=True,
    help="Instead: a hot model offloading attention to a cold model's device (Weaver): "
    "dedicated vs multiplexing vs weaving per device profile.",
)
@click.option("--profiles", default="simcuda,a100,l40s", help="--weaving: device profiles.")
@click.option(
    "--ratio", "weave_ratio", default=0.45, help="--weaving: offloaded share of the hot batch."
)
def simulate(
    trace_kind: str,
    duration: float | None,
    rate: float,
    cv: float,
    slices: str,
    placement: str,
    chunk: str,
    alpha: str,
    seed: int,
    as_json: bool,
    sharing: bool,
    n_models: int,
    n_devices: int,
    weaving: bool,
    profiles: str,
    weave_ratio: float,
) -> None:
    """Simulate several models served on one superchip's MIG slices over the shared C2C link:
    p50/p99 TTFT and TPOT, SLO attainment, C2C utilisation over time, for one policy choice.
    With --sharing: a long-tailed catalog on several devices under three sharing policies.
    With --weaving: a hot model offloading attention to a cold model's device (Weaver)."""
    import json

    if weaving:
        from medusa.weaver.command import simulate_weaving

        try:
            simulate_weaving(profiles, weave_ratio, as_json=as_json, echo=click.echo)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        return
    if sharing:
        _simulate_sharing(n_models, n_devices, duration or 300.0, seed, as_json)
        return
    duration = duration or 60.0

    from medusa.c2c.model import GH200_MIG
    from medusa.c2c.scheduler import PlacementError
    from medusa.c2c.simulator import (
        DEFAULT_MODELS,
        Policy,
        azure_trace,
        bursty_trace,
        sparkline,
    )
    from medusa.c2c.simulator import (
        simulate as run_sim,
    )

    try:
        profiles = [GH200_MIG[p.strip()] for p in slices.split(",") if p.strip()]
    except KeyError as e:
        raise click.UsageError(
            f"--slices: unknown profile {e}; known: {sorted(GH200_MIG)}"
        ) from None
    models = list(DEFAULT_MODELS)
    if Path(trace_kind).is_file():
        reqs = azure_trace(trace_kind, models, duration)
    elif trace_kind in ("gamma", "poisson"):
        reqs = bursty_trace(models, duration, rate, cv if trace_kind == "gamma" else 1.0, seed)
    else:
        raise click.UsageError(f"--trace {trace_kind!r}: use gamma, poisson or a CSV file")
    try:
        r = run_sim(models, profiles, reqs, Policy(placement, chunk, alpha), seed=seed)
    except PlacementError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    click.echo(
        f"{len(reqs)} requests, {len(profiles)} slices; policy placement={placement} "
        f"chunk={chunk} alpha={alpha}"
    )
    for k in ("p50_ttft", "p99_ttft", "p50_tpot", "p99_tpot", "slo_attainment"):
        click.echo(f"  {k:15} {r[k]:.3f}")
    click.echo(f"  placement       {r['placement']}")
    click.echo(f"  prefill chunk   {r['chunk']}")
    click.echo(f"  final alpha     {r['alpha']}")
    click.echo(f"  C2C utilisation |{sparkline(r['c2c_utilisation'])}|")


def _simulate_sharing(
    n_models: int, n_devices: int, duration: float, seed: int, as_json: bool
) -> None:
    import json

    from medusa.prism.placement import PlacementError
    from medusa.prism.simulate import compare

    if n_models < 1 or n_devices < 1 or duration <= 0:
        raise click.UsageError("--models and --devices must be >= 1 and --duration > 0")
    try:
        r = compare(n_models, n_devices, duration, seed, progress=lambda m: click.echo(m, err=True))
    except PlacementError as e:
        raise click.ClickException(f"{e} (try more --devices or fewer --models)") from None
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    base, mux = r["static"]["max_rps"] or 0.0, r["muxserve"]["max_rps"] or 0.0
    click.echo(
        f"{n_models} models (Zipf popularity, bursty), {n_devices} x 80 GiB devices, "
        f"{duration:.0f} s of trace, seed {seed}"
    )
    click.echo(f"{'policy':10} {'max load req/s':>15} {'vs static':>10} {'vs muxserve':>12} "
               f"{'devices for muxserve max':>25}")  # fmt: skip
    for name, row in r.items():
        rps, dev = row["max_rps"] or 0.0, row["devices"]
        click.echo(
            f"{name:10} {rps:15.2f} {_ratio(rps, base):>10} {_ratio(rps, mux):>12} "
            f"{dev if dev is not None else f'> {2 * n_devices}':>25}"
        )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


@main.command(short_help="Print what an artifact holds.")
@click.argument("artifact", type=click.Path(file_okay=False))
def inspect(artifact: str) -> None:
    """Print an artifact: model, device, KV size, graphs, relocations, kernels, files."""
    from medusa.artifact import ArtifactError, load_artifact
    from medusa.artifact.inspect import describe

    try:
        click.echo(describe(load_artifact(Path(artifact))))
    except ArtifactError as e:
        raise click.ClickException(str(e)) from None


@main.command(short_help="Check an artifact's integrity.")
@click.argument("artifact", type=click.Path(file_okay=False))
@trust_option
def verify(artifact: str, trust: str | None) -> None:
    """Run every check loading an artifact runs: the manifest's schema, its digest (and, with
    --trust, the signature), file names and types, every file's size and sha256, and the plan's
    decoding within the sizes the manifest records; and every chunk of the weight store against
    the checksums in its sealed header (a restored start checks them while it loads)."""
    from medusa.artifact import ArtifactError, verify_artifact
    from medusa.restore.validate import validate_plan

    try:
        art = verify_artifact(Path(artifact), trust=trust)
        validate_plan(art.plan, artifact)
    except ArtifactError as e:
        raise click.ClickException(str(e)) from None
    checked = " (trusted)" if trust else " (not checked: pass --trust PUBKEY)"
    signed = f", signed by {art.signer}{checked}" if art.signer else ", unsigned"
    w = art.manifest.get("weights")
    store = f", weight store: {w['chunks']} chunks checked" if w else ""
    click.echo(
        f"{artifact}: ok ({len(art.manifest['files'])} files{store}, schema "
        f"{art.manifest['schema']}, digest sha256:{art.seal.digest}{signed})"
    )


@main.command(short_help="Make a key pair to sign artifacts with.")
@click.argument("key", type=click.Path(dir_okay=False))
def keygen(key: str) -> None:
    """Write a new ed25519 private key to KEY (readable by you only) and its public key to
    KEY.pub: `medusa materialize --sign KEY`, then `medusa run --trust KEY.pub`."""
    from medusa.artifact.seal import generate_key

    try:
        pub = generate_key(Path(key))
    except FileExistsError as e:
        raise click.ClickException(f"{e.filename} exists; pick another name or remove it") from None
    click.echo(f"private key {key} (keep it secret), public key {pub}")


@main.group(short_help="Record a program's CUDA calls; read the traces.")
def trace() -> None:
    """Record a program's CUDA calls with the LD_PRELOAD recorder, and read the traces."""


@trace.command("record", context_settings={"ignore_unknown_options": True})
@click.option(
    "-o",
    "--output",
    "out",
    type=click.Path(dir_okay=False),
    default="medusa.mtr",
    show_default=True,
    help="Trace file to create (%p in the name becomes the pid).",
)
@click.option(
    "--mode",
    type=click.Choice(["record", "restore"]),
    default="record",
    show_default=True,
    help="restore: allocations only (what relocation needs).",
)
@click.option("--force", is_flag=True, help="Replace an existing trace and its side files.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def trace_record(out: str, mode: str, force: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND under the recorder: medusa trace record -o t.mtr -- python serve.py"""
    import subprocess
    from pathlib import Path

    from medusa.trace import recorder_env, remove_trace

    if Path(out).exists():
        if not force:
            raise click.UsageError(f"{out} exists; pass --force to replace it, or pick another -o")
        remove_trace(out)
    res = subprocess.run(list(command), env=recorder_env(out, mode=mode))
    if "%p" not in out and Path(out).exists():
        click.echo(f"trace written to {out} (read it with: medusa trace summarize {out})", err=True)
    raise SystemExit(res.returncode)


@trace.command("summarize")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--allow-truncated",
    is_flag=True,
    help="Read the complete records of a trace whose last record was cut off.",
)
def trace_summarize(file: str, allow_truncated: bool) -> None:
    """Print counts per event type, live memory over time, kernels by library and the graphs."""
    from medusa.trace import TraceError, read_trace, summarize

    try:
        t = read_trace(file, allow_truncated=allow_truncated)
    except TraceError as e:
        raise click.ClickException(str(e)) from None
    click.echo(summarize(t))


main.add_command(tessera)

if __name__ == "__main__":
    main(prog_name="medusa")
