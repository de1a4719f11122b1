"""What `--help` shows: every option of every `medusa` command says what it does, and the text
reads as written (click prints help verbatim: a `%%` written for %-formatting shows as `%%`)."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from medusa.cli import main


def _commands(cmd: click.Command, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(main, ()))


def _help(path: tuple[str, ...]) -> str:
    res = CliRunner().invoke(main, [*path, "--help"], terminal_width=100)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "medusa")
def test_every_option_in_help_says_what_it_does(path):
    out = _help(path)
    assert "%%" not in out
    # An option without help is a line of its own with nothing after its metavar.
    lines = out.split("Options:", 1)[-1].split("Commands:", 1)[0].splitlines()
    bare = [
        line.strip()
        for line, following in zip(lines, [*lines[1:], ""], strict=True)
        if line.startswith("  -")
        and len(line.split("  ")) <= 2
        and not following.startswith(" " * 8)
    ]
    assert not bare, f"medusa {' '.join(path)}: options without help: {bare}"


def test_simulate_help_shows_a_percent_sign_once():
    assert "99% TTFT attainment" in " ".join(_help(("simulate",)).split())


def test_tessera_plan_says_what_each_objective_minimizes():
    out = " ".join(_help(("tessera", "plan")).split())
    assert "throughput: minimize the pipeline period" in out
    assert "latency: minimize one step's kernel times" in out
