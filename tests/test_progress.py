"""Progress of long steps as a user sees it: in a log (stderr not a terminal) one plain line as
each step starts, no carriage return and no ANSI code; on a terminal, rich's redrawn display."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

import pytest

from medusa.progress import Progress
from tests.processes import without_medusa

PROGRAM = """
from medusa.progress import Progress, step
with Progress(steps=3) as p:
    with p.step("recording"):
        pass
    for _ in p.track(range(50), "placing graphs"):
        pass
    with p.step("writing", total=4) as s:
        s.advance(4)
print("result", flush=True)
with step("a step on its own"):
    pass
"""


def _env() -> dict[str, str]:
    return {**without_medusa(os.environ), "TERM": "xterm-256color"}


def test_a_file_gets_a_line_per_step_and_quiet_prints_nothing():
    log = io.StringIO()
    with Progress(log) as p, p.step("loading", total=3) as s:
        s.advance(3)
    assert list(Progress(log, steps=2).track("ab", "placing")) == ["a", "b"]
    with Progress(log, quiet=True).step("unseen"):
        pass
    assert log.getvalue() == "loading ...\n[1/2] placing ...\n"


@pytest.mark.e2e
def test_a_log_gets_one_plain_line_per_step():
    res = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        "[1/3] recording ...",
        "[2/3] placing graphs ...",
        "[3/3] writing ...",
        "a step on its own ...",
    ]
    assert "\r" not in res.stderr and "\x1b" not in res.stderr
    assert res.stdout == "result\n"  # progress never mixes into what a command prints


@pytest.mark.e2e
def test_a_terminal_gets_the_redrawn_display():
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], stdout=follower, stderr=follower, env=_env()
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the program exited and closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = out.decode(errors="replace")
    assert "\x1b[" in text and "[2/3] placing graphs" in text and "50/50" in text
    assert "[1/3] recording ..." not in text  # no plain lines on a terminal
