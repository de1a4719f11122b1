"""Start-up phases of a vLLM worker, marked for the recorder around the worker's own methods."""

from __future__ import annotations

import functools
from typing import Any

from medusa.trace import control as trace

# Worker method -> the phase it begins. Allocation identity is (phase, ordinal), so a restore
# that skips a phase (profiling, capture) still lines up with the phases it runs.
PHASES = {
    "init_device": "init_device",
    "load_model": "load_model",
    "determine_available_memory": "kv_profile",
    "initialize_from_config": "kv_alloc",
    "compile_or_warm_up_model": "graph_capture",
}
MARKED = "_medusa_phase"


def _wrap(fn: Any, phase: str) -> Any:
    @functools.wraps(fn)
    def marked(*args: Any, **kwargs: Any) -> Any:
        trace.mark(phase)
        try:
            return fn(*args, **kwargs)
        finally:
            if phase == "graph_capture":
                trace.mark("ready")  # the capture phase's buffers are snapshotted here

    setattr(marked, MARKED, phase)
    return marked


def install_phase_marks(worker_cls: type) -> list[str]:
    """Wraps each start-up method of worker_cls once; returns the phases installed."""
    done = []
    for method, phase in PHASES.items():
        fn = getattr(worker_cls, method, None)
        if fn is None:
            raise AttributeError(
                f"{worker_cls.__qualname__}.{method} is missing: this vLLM is not "
                "one the medusa plugin supports (see medusa/integrations/vllm)"
            )
        if getattr(fn, MARKED, None) is None:
            setattr(worker_cls, method, _wrap(fn, phase))
        done.append(phase)
    return done
