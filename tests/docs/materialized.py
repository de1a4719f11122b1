"""`medusa materialize` commands that several pages (and tests) run word for word, each run once
per test session.

The README, docs/gateway.md and docs/materialize.md each start with `medusa materialize --out
artifacts/smollm2-sim`, and tests/cli/test_newcomer.py runs docs/materialize.md's `medusa
materialize --weights host --max-num-seqs 4 --out a`: seven to ten seconds each on 2 cores. The
first run of such a command is the reader's own, in its page's scratch directory. A later run of
the same command line, in a directory where its `--out` does not exist yet, gets a copy of that
artifact (its weight stores linked: they are never written, and are most of its size) and what
that run printed, which the page's documented output is then checked against as usual.

A command is reused only when nothing it reads can differ from one page to the next: `medusa
materialize` with plain words (no quotes, variables, redirections or `;`), none of them an
absolute path or a file of the scratch directory (a model file, a signing key), and no
`--command`. A run that failed is not kept.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

PLAIN = re.compile(r"medusa materialize(?: [\w.=/-]+)+")


class Materialized:
    def __init__(self, root: Path) -> None:
        self.root = root  # where the kept artifacts are
        self.kept: dict[str, tuple[Path, str]] = {}  # command line -> (artifact, what it printed)

    def run(self, line: str, cwd: Path, execute: Callable[[], tuple[int, str]]) -> tuple[int, str]:
        """`execute()`'s exit status and output, or, for a command already run the same way,
        the output of that run, its artifact copied into `cwd`."""
        out = reusable_out(line, cwd)
        if out is None:
            return execute()
        if line in self.kept:
            artifact, printed = self.kept[line]
            link_copy(artifact, cwd / out)
            return 0, printed
        status, printed = execute()
        if status == 0 and (cwd / out).is_dir():
            kept = link_copy(cwd / out, self.root / str(len(self.kept)) / out)
            self.kept[line] = (kept, printed)
        return status, printed


def reusable_out(line: str, cwd: Path) -> str | None:
    """The `--out` of a `medusa materialize` command line run in `cwd` whose artifact and output
    depend on nothing but its words (see the module's docstring); None for any other line."""
    if not PLAIN.fullmatch(line):
        return None
    words = line.split()[2:]
    if "--command" in words or "--out" not in words[:-1]:
        return None
    at = words.index("--out") + 1
    values = [w.split("=", 1)[-1] for i, w in enumerate(words) if i != at]
    if any(v.startswith("/") or (cwd / v).exists() for v in [words[at], *values]):
        return None
    return words[at]


def link_copy(src: Path, dst: Path) -> Path:
    """A copy of the artifact SRC at DST, its weight stores (`*.store`) hard links."""

    def copy(s: str, d: str) -> object:
        if s.endswith(".store"):
            os.link(s, d)
            return d
        return shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=copy, symlinks=True)
    return dst
