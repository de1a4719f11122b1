"""MEDUSA_HOLD_WEIGHTS (tests only): a weight store's reader stops part way, so that a test can
change the file at a known point of the read (truncate it, write through a mapping) and see what
the reader then does. Unset, nothing here runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

from medusa import env


def held_at() -> tuple[int, Path] | None:
    """(chunk, directory) from MEDUSA_HOLD_WEIGHTS=N:DIR, or None."""
    raw = env.HOLD_WEIGHTS.get()
    if not raw:
        return None
    n, sep, where = raw.partition(":")
    if not sep or not n.isdigit() or not where:
        raise ValueError(f"{env.HOLD_WEIGHTS.name}={raw!r}: expected N:DIR (tests only)")
    return int(n), Path(where)


def wait_to_go(where: Path, timeout: float = 300.0) -> None:
    """Says this process is held (DIR/held-<pid>) and waits for DIR/go-<pid>."""
    pid = os.getpid()
    (where / f"held-{pid}").touch()
    deadline = time.monotonic() + timeout
    while not (where / f"go-{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
