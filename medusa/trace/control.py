"""The recorder's control API, for code running inside a recorded process.

Every call is a no-op when the process is not being recorded, so engines call these freely.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from medusa.cuda import paths


@cache
def _lib() -> ctypes.CDLL | None:
    # NOTE: the preloaded library is in the global scope; loading it here would start a second
    # recorder, so only look it up.
    glob = ctypes.CDLL(None)
    try:
        fn = glob.medusa_trace_active
    except AttributeError:
        return None
    fn.restype = ctypes.c_int
    glob.medusa_trace_mark.argtypes = [ctypes.c_char_p]
    glob.medusa_trace_flush.restype = ctypes.c_int
    return glob


def active() -> bool:
    """True when this process is being recorded (MEDUSA_TRACE set and the recorder preloaded)."""
    lib = _lib()
    return bool(lib and lib.medusa_trace_active())


def pause() -> None:
    if lib := _lib():
        lib.medusa_trace_pause()


def resume() -> None:
    if lib := _lib():
        lib.medusa_trace_resume()


@contextmanager
def paused() -> Iterator[None]:
    """Calls made inside are not recorded (they pass through unchanged)."""
    pause()
    try:
        yield
    finally:
        resume()


def mark(phase: str) -> None:
    """Marks the start of a start-up phase (weights, kv-profile, capture, ...) in the trace."""
    if lib := _lib():
        lib.medusa_trace_mark(phase.encode())


def flush() -> bool:
    """Writes buffered records to the file (before os._exit, for instance)."""
    lib = _lib()
    return lib is not None and lib.medusa_trace_flush() == 0


def interposer_path() -> Path:
    return paths.library("medusa_interpose")


def recorder_env(
    trace: str | Path, *, mode: str = "record", base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment that records a child process into `trace`."""
    if mode not in ("record", "restore"):
        raise ValueError(f"mode={mode!r}: use 'record' or 'restore'")
    env = dict(os.environ if base is None else base)
    preload = [str(interposer_path())] + [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    env.update(LD_PRELOAD=":".join(preload), MEDUSA_TRACE=str(trace), MEDUSA_MODE=mode)
    return env


def remove_trace(trace: str | Path) -> None:
    """Removes a trace and its side files, so that a new recording can create it."""
    p = Path(trace)
    for side in (p, p.with_name(p.name + ".blobs")):
        side.unlink(missing_ok=True)
    shutil.rmtree(p.with_name(p.name + ".images"), ignore_errors=True)
