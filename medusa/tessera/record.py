"""Recording the reference engine's start-up for Tessera: the instrumented run records as
materialize's first run does, then replays every decode graph with simcuda's access
instrumentation on for graph launches (MEDUSA_SIM_ACCESSES=graphs): the larger ones on the
engine's probe input, the smallest in a real decode step after a prompt of a few blocks' worth of
tokens, so that its attention reads KV-cache pages an earlier step wrote (what marks the cache as
state). Each recording runs medusa.tessera.instrumented_run. Against a shifted recording
(materialize's second run) it cross-checks the pointer classification (`medusa materialize
--check-accesses`, tests)."""

from __future__ import annotations

import functools
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from medusa.child import python_module
from medusa.engine.config import EngineConfig
from medusa.engine.materialize import RecordingCheck
from medusa.materialize.analysis import MaterializeError
from medusa.materialize.driver import Echo, record_run
from medusa.tessera.crosscheck import crosscheck
from medusa.trace import read_trace
from medusa.trace.run_view import RunView

DEFAULT_KV_BYTES = 64 << 20  # enough for the probe's decode step; no profiling pass
PROGRAM = "medusa.tessera.instrumented_run"

# NOTE: one BLAS thread: faults from many threads serialize on the address-space lock.
INSTRUMENTED = {"MEDUSA_SIM_ACCESSES": "graphs", "OPENBLAS_NUM_THREADS": "1"}


def record_instrumented(
    config: EngineConfig, trace: Path, store: str = "", echo: Echo = lambda _: None
) -> float:
    """Records run 0's start-up (as materialize does) and the graph replays, accesses on;
    returns the seconds it took. config must fix the KV size (kv_cache_memory)."""
    cmd = python_module(PROGRAM, json.dumps(asdict(config)), "probe", store)
    return record_run(cmd, trace, 0, "sim", echo, INSTRUMENTED, "the instrumented run")


def record_engine(config: EngineConfig, work: Path) -> tuple[RunView, RunView]:
    """(instrumented run, shifted run) of the engine's start-up on simcuda."""
    if config.kv_cache_memory is None:
        config = replace(config, kv_cache_memory=DEFAULT_KV_BYTES)
    work.mkdir(parents=True, exist_ok=True)
    record_instrumented(config, work / "0.mtr")
    cmd = python_module(PROGRAM, json.dumps(asdict(config)), "-", "")
    record_run(cmd, work / "1.mtr", 1, "sim", lambda _: None, {"MEDUSA_SIM_ACCESSES": "0"})
    return RunView.build(read_trace(work / "0.mtr")), RunView.build(read_trace(work / "1.mtr"))


def pointer_check(kind: str, *, strict: bool) -> RecordingCheck:
    """`medusa materialize --check-accesses`: the check medusa.engine.materialize runs after its
    analysis; refused (MaterializeError) off simcuda."""
    if kind != "sim":
        raise MaterializeError(
            "--check-accesses records kernels' accesses with simcuda's page protection; on a "
            "GPU that needs PTX instrumentation, which scripts/gpu does not run yet: drop it, "
            "or materialize on simcuda (MEDUSA_DEVICE=sim)"
        )
    return functools.partial(check_pointer_accesses, strict=strict)


def check_pointer_accesses(
    config: EngineConfig, work: Path, store: str, echo: Echo, *, strict: bool
) -> float:
    """Records run 0 again with kernels' accesses on (every graph replayed) and checks them
    against the two-run pointer classification of work/1.mtr: a word called a pointer must be
    dereferenced, a dereferenced word must be a pointer. Disagreements are warnings, or with
    `strict` a MaterializeError naming them. Returns the seconds it took."""
    t0 = time.perf_counter()
    record_instrumented(config, work / "accesses.mtr", store, echo)
    check = crosscheck(
        RunView.build(read_trace(work / "accesses.mtr")), RunView.build(read_trace(work / "1.mtr"))
    )
    echo(
        f"  {check.nodes_checked} kernel nodes checked, {check.nodes_unknown} without recorded "
        f"accesses, {len(check.disagreements)} disagreements"
    )
    for d in check.disagreements:
        echo(f"  warning: {d}")
    if strict and check.disagreements:
        raise MaterializeError(
            f"--strict: the access analysis disagrees with the pointer classification on "
            f"{len(check.disagreements)} parameter(s), first: {check.disagreements[0]}; no "
            "artifact was written"
        )
    return time.perf_counter() - t0
