"""The `medusa` command line. Commands are thin: they parse, call the package, print."""

from __future__ import annotations

from typing import Any

import click

from medusa import __version__
from medusa.commands.artifacts import inspect, keygen, trace, verify
from medusa.commands.gateway import gateway
from medusa.commands.materialize import materialize
from medusa.commands.run import run
from medusa.commands.simulate import simulate
from medusa.errors import MedusaError
from medusa.tessera.command import tessera  # cheap: it imports its work where used


class _InOrder(click.Group):
    """Lists commands in the order they are defined (the order a user needs them), not A-Z.

    An error of ours that a command did not turn into a message itself is printed as one
    ("Error: ..." and exit status 1): its text already says what to do, a traceback would bury it.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MedusaError as e:
            raise click.ClickException(str(e)) from None


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


for command in (run, materialize, gateway, simulate, inspect, verify, keygen, trace, tessera):
    main.add_command(command)

if __name__ == "__main__":
    main(prog_name="medusa")
