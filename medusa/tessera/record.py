"""Recording the reference engine's start-up for Tessera: two recordings as materialize makes
them (the second shifted); the first then replays every decode graph with simcuda's access
instrumentation on for graph launches (MEDUSA_SIM_ACCESSES=graphs): the larger ones on the engine's
probe input, the smallest in a real decode step after a prompt of a few blocks' worth of tokens, so
that its attention reads KV-cache pages an earlier step wrote (what marks the cache as state)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path

from medusa.child import python_code
from medusa.engine.config import EngineConfig
from medusa.materialize.analysis import RunView
from medusa.materialize.driver import record_run
from medusa.trace import read_trace

DEFAULT_KV_BYTES = 64 << 20  # enough for the probe's decode step; no profiling pass

SCRIPT = """
import json, sys
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
e = LLMEngine(EngineConfig(**json.loads(sys.argv[1])))
out = {"graphs": sorted(e.runner.graphs)}
if sys.argv[2] == "probe":
    from medusa.engine.sampling import SamplingParams
    for s in sorted(e.runner.graphs)[1:]:
        e.runner.probe(s)
    prompt = "Count with me, slowly and carefully: one, two, three, four, five, six, seven"
    # sampled, not greedy: greedy sampling never reads top_p or the seeds
    sp = SamplingParams(max_tokens=2, temperature=0.8, top_p=0.9, seed=1)
    out["text"] = e.generate([prompt], sp)[0]
print(json.dumps(out))
"""


def record_engine(config: EngineConfig, work: Path) -> tuple[RunView, RunView]:
    """(instrumented run, shifted run) of the engine's start-up on simcuda."""
    if config.kv_cache_memory is None:
        config = replace(config, kv_cache_memory=DEFAULT_KV_BYTES)
    work.mkdir(parents=True, exist_ok=True)
    views = []
    for run in (0, 1):
        cmd = python_code(SCRIPT, json.dumps(asdict(config)), "probe" if run == 0 else "-")
        saved = {k: os.environ.get(k) for k in ("MEDUSA_SIM_ACCESSES", "OPENBLAS_NUM_THREADS")}
        # NOTE: one BLAS thread: faults from many threads serialize on the address-space lock.
        os.environ.update(
            MEDUSA_SIM_ACCESSES="graphs" if run == 0 else "0", OPENBLAS_NUM_THREADS="1"
        )
        try:
            record_run(cmd, work / f"{run}.mtr", run, "sim", lambda _: None)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        views.append(RunView.build(read_trace(work / f"{run}.mtr")))
    return views[0], views[1]
