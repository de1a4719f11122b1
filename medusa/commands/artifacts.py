"""Artifact and trace commands: `medusa inspect`, `verify`, `keygen`, `trace record|summarize`."""

from __future__ import annotations

from pathlib import Path

import click

from medusa.commands.options import trust_option


@click.command(short_help="Print what an artifact holds.")
@click.argument("artifact", type=click.Path(file_okay=False))
def inspect(artifact: str) -> None:
    """Print an artifact: model, device, KV size, graphs, relocations, kernels, files, and the
    settings `medusa run --artifact` takes from it."""
    from medusa.artifact import ArtifactError, load_artifact
    from medusa.artifact.inspect import describe
    from medusa.engine.artifact_settings import ArtifactSettings, unusable_settings

    try:
        click.echo(describe(load_artifact(Path(artifact))))
    except ArtifactError as e:
        raise click.ClickException(str(e)) from None
    settings = ArtifactSettings.read(artifact)
    if settings is not None:
        click.echo(f"  runs with {settings.summary()}")
        click.echo("            (medusa run --artifact takes these; a flag with another value is "
                   "refused)")  # fmt: skip
    elif problem := unusable_settings(artifact):
        click.echo(f"  runs with {problem}")


@click.command(short_help="Check an artifact's integrity.")
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
        parts = art.parts()  # a tensor-parallel artifact's every rank
        for part in parts:
            validate_plan(part.plan, artifact)
    except ArtifactError as e:
        raise click.ClickException(str(e)) from None
    checked = " (trusted)" if trust else " (not checked: pass --trust PUBKEY)"
    signed = f", signed by {art.signer}{checked}" if art.signer else ", unsigned"
    chunks = [p.manifest["weights"]["chunks"] for p in parts if "weights" in p.manifest]
    stores = "weight store" if len(parts) == 1 else f"{len(chunks)} weight stores"
    store = f", {stores}: {sum(chunks)} chunks checked" if chunks else ""
    click.echo(
        f"{artifact}: ok ({len(art.manifest['files'])} files{store}, schema "
        f"{art.manifest['schema']}, digest sha256:{art.seal.digest}{signed})"
    )


@click.command(short_help="Make a key pair to sign artifacts with.")
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


@click.group(short_help="Record a program's CUDA calls; read the traces.")
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
