"""`python -m medusa.weaver.pair`: a receiver the hot side gives up on (a heartbeat missed, as a
starved cold process on a busy machine misses it) is stopped, and the program ends with the
reason instead of waiting for it and dying with a traceback (tests/docs once did, under load)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.cli.test_newcomer import without_medusa

# Starts two engines in two processes (see pyproject.toml's e2e marker).
pytestmark = pytest.mark.e2e


def test_each_step_is_logged_and_a_receiver_given_up_on_is_stopped_with_the_reason():
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "medusa.weaver.pair", "--ratio", "1", "--max-tokens", "4",
         "--timeout", "0.000001", "What is 2 + 2?"],
        capture_output=True, text=True, timeout=300, env=without_medusa(os.environ),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    # a line as each long step starts (the warnings of the lost receiver come between)
    assert [line for line in res.stderr.splitlines() if line.startswith("[")] == [
        "[1/3] starting the hot engine ...",
        "[2/3] starting the cold engine in another process ...",
        "[3/3] generating, 1.0 of the sequences offloaded ...",
    ]
    assert "receiver lost: the receiver (pid" in res.stdout, res.stdout
    assert "hot: 'What is 2 + 2?' -> " in res.stdout  # recomputed locally
    assert "Traceback" not in res.stderr
    assert time.monotonic() - t0 < 120  # the cold engine was not waited for until a timeout


@pytest.mark.parametrize("bad", ["0", "nan", "inf"])
def test_the_timeout_must_be_positive_seconds(bad):
    res = subprocess.run(
        [sys.executable, "-m", "medusa.weaver.pair", "--timeout", bad],
        capture_output=True, text=True, timeout=60, env=without_medusa(os.environ),
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.splitlines()[-1].endswith(
        f"error: --timeout {float(bad)}: give positive seconds"
    )
