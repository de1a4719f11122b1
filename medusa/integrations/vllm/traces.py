"""Which of a recorded vLLM start-up's traces is the engine core's.

vLLM starts helper processes (compile workers, the API server beside the engine core) and any of
them may touch CUDA. With one trace name the first such process would take the file and the
engine core would stop recording, so every process records into its own trace (`%p`: the pid),
and the engine core's is told apart by what it holds: the graph-capture phase the plugin marks.
"""

from __future__ import annotations

from pathlib import Path

from medusa.integrations.vllm.phases import SKIPPED
from medusa.materialize.analysis import MaterializeError
from medusa.trace import read_trace
from medusa.trace import records as R
from medusa.trace.format import Ev

PER_PROCESS = "%p"


def trace_pattern(work: Path, stem: str) -> Path:
    """The trace path to record a start-up under: one file per process."""
    return work / f"{stem}-{PER_PROCESS}.mtr"


def process_traces(work: Path, stem: str) -> list[Path]:
    """The traces the processes of one recorded start-up wrote (their side files excluded)."""
    return sorted(work.glob(f"{stem}-*.mtr"))


def marks_of(path: Path) -> set[str]:
    trace = read_trace(path, allow_truncated=True)
    return {m.phase for m in trace.of(R.Mark, Ev.MARK)}


def engine_core_trace(traces: list[Path]) -> Path:
    """The one trace that holds the marked graph capture; MaterializeError unless exactly one
    does (the message says what each trace holds)."""
    held = {p: marks_of(p) for p in traces}
    found = [p for p, marks in held.items() if set(SKIPPED) <= marks]
    if len(found) == 1:
        return found[0]
    seen = "; ".join(f"{p.name}: {sorted(m) or 'no phase marks'}" for p, m in held.items())
    if not found:
        raise MaterializeError(
            f"no process recorded vLLM's graph capture ({len(traces)} traces: {seen or 'none'}); "
            "was the medusa plugin loaded, and did the engine core record (a trace path "
            f"without {PER_PROCESS} lets the first process that touches CUDA take it)?"
        )
    raise MaterializeError(
        f"{len(found)} processes recorded a graph capture ({seen}): one engine core expected "
        "(tensor or data parallelism is not supported)"
    )
