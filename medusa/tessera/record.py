"""Recording the reference engine's start-up for Tessera: the instrumented run records as
materialize's first run does, then replays every decode graph with simcuda's access
instrumentation on for graph launches (MEDUSA_SIM_ACCESSES=graphs): the larger ones on the
engine's probe input, the smallest in a real decode step after a prompt of a few blocks' worth of
tokens, so that its attention reads KV-cache pages an earlier step wrote (what marks the cache as
state). Against a shifted recording (materialize's second run) it cross-checks the pointer
classification (`medusa materialize --check-accesses`, tests)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from medusa.child import python_code
from medusa.engine.config import EngineConfig
from medusa.materialize.analysis import RunView
from medusa.materialize.driver import Echo, record_run
from medusa.trace import read_trace

DEFAULT_KV_BYTES = 64 << 20  # enough for the probe's decode step; no profiling pass

SCRIPT = """
import json, sys
from medusa import plugins
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
plugins.register()  # what the config may name (kv_memory="elastic")
e = LLMEngine(EngineConfig(**json.loads(sys.argv[1])), store=sys.argv[3] or None)
if e.store_error:
    sys.exit("the weight store was not used: " + e.store_error)
out = {"graphs": sorted(e.runner.graphs)}
if sys.argv[2] == "probe":
    from medusa.engine.sampling import SamplingParams
    for s in sorted(e.runner.graphs)[1:]:
        e.runner.probe(s)
    prompt = "Count with me, slowly and carefully: one, two, three, four, five, six, seven"
    cfg = e.config  # as much of the prompt as one prefill chunk and the context take
    fits = min(cfg.max_num_batched_tokens, cfg.max_model_len - 2) - 1
    # sampled, not greedy: greedy sampling never reads top_p or the seeds
    sp = SamplingParams(max_tokens=2, temperature=0.8, top_p=0.9, seed=1)
    seq = e.add_request(e.tokenizer.encode(prompt)[:fits], sp)
    while e.has_unfinished():
        e.step()
    out["tokens"] = seq.completion_ids
print(json.dumps(out))
"""

# NOTE: one BLAS thread: faults from many threads serialize on the address-space lock.
INSTRUMENTED = {"MEDUSA_SIM_ACCESSES": "graphs", "OPENBLAS_NUM_THREADS": "1"}


def record_instrumented(
    config: EngineConfig, trace: Path, store: str = "", echo: Echo = lambda _: None
) -> float:
    """Records run 0's start-up (as materialize does) and the graph replays, accesses on;
    returns the seconds it took. config must fix the KV size (kv_cache_memory)."""
    cmd = python_code(SCRIPT, json.dumps(asdict(config)), "probe", store)
    return record_run(cmd, trace, 0, "sim", echo, INSTRUMENTED, "the instrumented run")


def record_engine(config: EngineConfig, work: Path) -> tuple[RunView, RunView]:
    """(instrumented run, shifted run) of the engine's start-up on simcuda."""
    if config.kv_cache_memory is None:
        config = replace(config, kv_cache_memory=DEFAULT_KV_BYTES)
    work.mkdir(parents=True, exist_ok=True)
    record_instrumented(config, work / "0.mtr")
    cmd = python_code(SCRIPT, json.dumps(asdict(config)), "-", "")
    record_run(cmd, work / "1.mtr", 1, "sim", lambda _: None, {"MEDUSA_SIM_ACCESSES": "0"})
    return RunView.build(read_trace(work / "0.mtr")), RunView.build(read_trace(work / "1.mtr"))
