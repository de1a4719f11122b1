"""The `medusa` command line. Commands are thin: they parse, call the package, print."""

from __future__ import annotations

import click

from medusa import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="medusa")
def main() -> None:
    """Medusa: materialize an LLM server's start-up once, restore it at every cold start."""


@main.command()
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


if __name__ == "__main__":
    main()
