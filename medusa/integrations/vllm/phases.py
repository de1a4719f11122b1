"""Start-up phases of a vLLM worker, marked for the recorder around the worker's own methods."""

from __future__ import annotations

import functools
import time
from typing import Any

from medusa.trace import control as trace

# Worker method -> the phase it begins. Allocation identity is (phase, ordinal), so a restore
# that skips a phase (the graph capture) still lines up with the phases it runs.
PHASES = {
    "init_device": "init_device",
    "load_model": "load_model",
    "determine_available_memory": "kv_profile",
    "initialize_from_config": "kv_alloc",
    "compile_or_warm_up_model": "warmup",
}
# The V2 model runner's capture (not its profiling capture) is the phase a restore replaces.
RUNNER_PHASES = {"capture_model": "graph_capture"}
SKIPPED = ("graph_capture",)
MARKED = "_medusa_phase"
TIMINGS: dict[str, float] = {}  # phase -> seconds its method took in this process


def _timed(phase: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        TIMINGS[phase] = TIMINGS.get(phase, 0.0) + time.perf_counter() - t0


def _wrap(fn: Any, phase: str) -> Any:
    if phase == "graph_capture":

        @functools.wraps(fn)
        def captured(self: Any, *, profile_only: bool = False) -> Any:
            if profile_only:  # vLLM's memory profiling capture: part of kv_profile
                return fn(self, profile_only=True)
            trace.mark(phase)
            try:
                return _timed(phase, fn, self, profile_only=False)
            finally:
                trace.mark("ready")  # the capture phase's buffers are snapshotted here

        marked = captured
    else:

        @functools.wraps(fn)
        def marked(*args: Any, **kwargs: Any) -> Any:
            trace.mark(phase)
            return _timed(phase, fn, *args, **kwargs)

    setattr(marked, MARKED, phase)
    return marked


def _install(cls: type, phases: dict[str, str]) -> list[str]:
    done = []
    for method, phase in phases.items():
        fn = getattr(cls, method, None)
        if fn is None:
            raise AttributeError(
                f"{cls.__qualname__}.{method} is missing: this vLLM is not one the medusa "
                "plugin supports (see medusa/integrations/vllm)"
            )
        if getattr(fn, MARKED, None) is None:
            setattr(cls, method, _wrap(fn, phase))
        done.append(phase)
    return done


def install_phase_marks(worker_cls: type, runner_cls: type | None = None) -> list[str]:
    """Wraps each start-up method of worker_cls (and the runner's capture) once; returns the
    phases installed."""
    done = _install(worker_cls, PHASES)
    if runner_cls is not None:
        done += _install(runner_cls, RUNNER_PHASES)
    return done
