"""Command lines for child Python processes that run the same Medusa as this process.

`python -m medusa.cli` and `python -c CODE` put the child's working directory first on sys.path, so
a worker started from inside a checkout would import the source tree instead of the installed
package (or another checkout's). Every child Medusa starts goes through here instead.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import medusa
from medusa import env

# The directory this process imported `medusa` from.
ROOT = str(Path(medusa.__file__).resolve().parent.parent)
_FIRST = f"import sys; sys.path[0] = {ROOT!r}\n"


def python_code(code: str, *args: str) -> list[str]:
    """argv that runs CODE (as `python -c`) importing medusa from where this process did."""
    return [sys.executable, "-c", _FIRST + code, *args]


def python_module(module: str, *args: str) -> list[str]:
    """argv that runs `python -m MODULE ARGS` importing medusa from where this process did."""
    run = f"import runpy; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return python_code(run, *args)


def medusa_cli(*args: str) -> list[str]:
    """argv for `medusa ARGS` run by this interpreter and this copy of the package."""
    return python_module("medusa.cli", *args)


def tied_to_this_process(child_env: dict[str, str]) -> dict[str, str]:
    """child_env for a child that must not outlive this process (`medusa run` calls
    die_with_parent() first thing)."""
    return {**child_env, env.PARENT_PID.name: str(os.getpid())}


def die_with_parent() -> None:
    """With MEDUSA_PARENT_PID set, ask the kernel for SIGTERM when that parent dies, even by
    SIGKILL (Linux's parent-death signal), and exit now if it has died already.

    NOTE: set in the child itself rather than in a preexec_fn, which is unsafe in a parent that
    runs threads (the gateway does). The signal fires when the parent's *thread* that forked exits.
    """
    parent = env.PARENT_PID.get()
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def exit_on_sigterm() -> None:
    """SIGTERM (what the gateway sends, and the parent-death signal) raises SystemExit in the
    main thread, so that `finally` blocks and atexit handlers run: uvicorn, stopped by SIGTERM,
    shuts down and then raises the signal again, which by default ends the process on the spot."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
