"""`medusa run --engine vllm`: `vllm serve` with the medusa plugin, restored from an artifact
when one is given (medusa.integrations.vllm.serve), in place of this process."""

from __future__ import annotations

import os

import click


def run_vllm(
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
