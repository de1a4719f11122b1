"""`medusa run --partition PLAN`: the reference engine serving with its decode graphs split across
itself and a follower process by a placement `medusa tessera place` wrote; the same answer as
unsplit, and a plan that does not fit the artifact refused with the fix."""

from __future__ import annotations

import json
import re
import socket

import pytest

from tests.processes import medusa
from tests.tessera.conftest import CONFIG

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

OPTS = [f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def demo(art, *args):  # type: ignore[no-untyped-def]
    model = str(art.parent / "tiny.gguf")
    res = medusa("run", model, *OPTS, "--artifact", str(art), "--require-artifact",
                 "--demo", "hello there", "--port", str(_port()), *args)  # fmt: skip
    answer = res.stdout[res.stdout.find("assistant: ") :]
    return res, re.sub(r"\(\d+ tokens in [0-9.]+ s\)", "", answer)  # the timing aside


def test_a_partitioned_server_answers_as_one_device(tiny, tmp_path):
    art, _ = tiny
    plan = tmp_path / "plan.json"
    res = medusa("tessera", "place", str(art), "--out", str(plan), "--how", "random")
    assert res.returncode == 0, res.stderr[-3000:]
    # a log of the long steps: a line as each starts, nothing redrawn
    assert res.stderr.splitlines() == [
        "[1/2] recording the start-up and graph replays with kernel accesses on ...",
        "[2/2] analyzing the decode graphs' accesses ...",
    ]
    one, expected = demo(art)
    assert one.returncode == 0 and "assistant: " in expected, one.stderr[-3000:]
    split, answer = demo(art, "--partition", str(plan), "-v")
    assert split.returncode == 0, split.stderr[-3000:]
    assert answer == expected
    steps = re.search(r"tessera: (\d+) decode steps split over two processes", split.stderr)
    assert steps and int(steps.group(1)) > 10, split.stderr[-3000:]


def test_a_plan_that_does_not_fit_the_artifact_is_refused_with_the_fix(tiny, tmp_path):
    art, _ = tiny
    plan = tmp_path / "plan.json"
    assert medusa("tessera", "place", str(art), "--out", str(plan)).returncode == 0
    body = json.loads(plan.read_text())
    for name, change, says in [
        ("other.json", {"artifact_sha256": "0" * 64}, "made for another artifact"),
        ("short.json", {"graphs": [g[:-1] for g in body["graphs"]]}, "needs device 0 or 1"),
    ]:
        (tmp_path / name).write_text(json.dumps({**body, **change}))
        res, _ = demo(art, "--partition", str(tmp_path / name))
        assert res.returncode != 0
        assert says in res.stderr and "medusa tessera place" in res.stderr, res.stderr[-2000:]
        assert "Traceback" not in res.stderr
    res = medusa("run", "--partition", str(plan), "--port", str(_port()))
    assert res.returncode == 2 and "needs --artifact" in res.stderr
