"""Runs one page's examples as a reader would, in order, in one scratch directory.

The directory holds a copy of the repository's `runtime/` (its catalog names artifacts
relative to itself, which must land in the scratch directory) and links to its `scripts/` and
`tests/`; `medusa` is this interpreter running this checkout's package (`PYTHONPATH`), and
`python` is this interpreter's (its folder comes next on `PATH`). Each command runs in
`bash -c` with its output and errors merged.
Ports: every port a page names (`--port N`, `localhost:N`, and 8000, `medusa run`'s default)
is mapped to a free one, in commands and documented output alike, and a `medusa run` that names
no port is given the mapped 8000. A background command (`… &`) is waited for until its
documented lines have been printed and, when it names a port, `/health` there answers 200;
background commands are stopped (SIGTERM, then SIGKILL) when the page is done. A `medusa
materialize` that another page (or test) ran word for word before runs once a session
(tests/docs/materialized.py).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.docs.examples import REPO, Block, Command, mask, matches
from tests.docs.materialized import Materialized
from tests.processes import clean_env

COMMAND_TIMEOUT = 900
READY_TIMEOUT = 240
PORTS = re.compile(r"(?:--port\s+|localhost:|127\.0\.0\.1:)(\d{4,5})\b")


class Session:
    def __init__(
        self, root: Path, blocks: list[Block], materialized: Materialized | None = None
    ) -> None:
        self.root = root
        self.materialized = materialized
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []
        bin_dir = root / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "medusa"
        shim.write_text(
            f"#!/bin/sh\nexec {sys.executable} -c "
            '\'import sys; from medusa.cli import main; main(prog_name="medusa")\' "$@"\n'
        )
        shim.chmod(0o755)
        shutil.copytree(REPO / "runtime", root / "runtime")
        for name in ("scripts", "tests"):
            (root / name).symlink_to(REPO / name)
        self.env = clean_env()
        self.env["PYTHONPATH"] = str(REPO)
        python_dir = Path(sys.executable).parent
        path = [str(bin_dir), str(python_dir), self.env.get("PATH", "")]
        self.env["PATH"] = os.pathsep.join(path)
        text = "\n".join(c.text + "\n" + "\n".join(c.output) for b in blocks for c in b.commands)
        self.ports = {n: _free_port() for n in {"8000", *PORTS.findall(text)}}

    def subst(self, text: str) -> str:
        return PORTS.sub(lambda m: m.group(0).replace(m.group(1), self.ports[m.group(1)]), text)

    def command_line(self, command: Command) -> str:
        text = self.subst(command.text)
        if re.match(r"medusa run\b", text) and not re.search(r"--(port|uds|fd)\b", text):
            text = text.replace("medusa run", f"medusa run --port {self.ports['8000']}", 1)
        if command.background:
            text = re.sub(r"(?<!&)&\s*(#.*)?$", "", text.splitlines()[0])
        return text

    def run(self, block: Block) -> list[str]:
        """Runs a block's commands; the problems found, one per command that differs."""
        problems = []
        for command in block.commands:
            documented = mask(self.subst("\n".join(command.output)))
            line = self.command_line(command)
            if command.background:
                printed = self._start(line, documented)
            else:
                _, printed = self.execute(line)
                if matches(documented, mask(printed)):
                    continue
            if printed is None:
                continue
            problems.append(
                f"{block.where}: $ {command.text}\n--- documented (masked)\n"
                + "\n".join(documented) + "\n--- printed (masked)\n" + "\n".join(mask(printed))
            )  # fmt: skip
        return problems

    def execute(self, line: str) -> tuple[int, str]:
        """Runs a command line to its end: its exit status and what it printed (a `medusa
        materialize` that ran the same way before is not run again: tests/docs/materialized.py)."""

        def run() -> tuple[int, str]:
            res = subprocess.run(["bash", "-c", line], cwd=self.root, env=self.env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 timeout=COMMAND_TIMEOUT)  # fmt: skip
            return res.returncode, res.stdout.decode(errors="replace")

        return self.materialized.run(line, self.root, run) if self.materialized else run()

    def _start(self, line: str, documented: list[str]) -> str | None:
        """Starts a background command; None once it is ready, else what it printed."""
        log = self.root / f".background-{len(self.background)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=self.root, env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        self.background.append((proc, log))
        port = re.search(r"--port\s+(\d+)", line)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            printed = log.read_text(errors="replace")
            if matches(documented, mask(printed), prefix=True) and (
                port is None or _healthy(int(port.group(1)))
            ):
                return None
            time.sleep(0.5)
        return log.read_text(errors="replace") + f"\n(not ready: exit status {proc.poll()})"

    def close(self) -> None:
        for proc, _ in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in self.background:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False
