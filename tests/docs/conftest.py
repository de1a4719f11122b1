from __future__ import annotations

import pytest

from tests.docs.test_examples import ALL


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    run = [b for bs in ALL.values() for b in bs if b.not_run is None]
    not_run = [b for bs in ALL.values() for b in bs if b.not_run is not None]
    commands = sum(len(b.commands) for b in run)
    terminalreporter.write_line(
        f"documented examples: {commands} commands in {len(run)} blocks run by "
        f"tests/docs; {len(not_run)} blocks not run"
    )
    for b in not_run:
        terminalreporter.write_line(f"  not run: {b.where}: {b.not_run}")
