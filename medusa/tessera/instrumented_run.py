"""The program Tessera's recordings run (medusa.tessera.record starts it): starts the engine and,
with MODE "probe", replays every decode graph but the smallest on the engine's probe input, then
decodes a prompt of a few blocks' worth of tokens (the smallest graph's real step); prints the
graphs' batch sizes (and the tokens) as JSON.

    python -m medusa.tessera.instrumented_run CONFIG MODE STORE

CONFIG: the EngineConfig as JSON; MODE: "probe" or "-" (start up only); STORE: a weight store to
load the weights from ("" for the model file)."""

from __future__ import annotations

import json
import sys
from typing import Any

from medusa import plugins
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams

PROMPT = "Count with me, slowly and carefully: one, two, three, four, five, six, seven"


def probe(e: LLMEngine) -> list[int]:
    """Replays the larger decode graphs and every prefill graph, then decodes PROMPT; returns the
    tokens it sampled."""
    for s in sorted(e.runner.graphs)[1:]:
        e.runner.probe(s)
    for t in sorted(e.runner.prefill.graphs):
        e.runner.prefill.probe(t)
    cfg = e.config  # as much of the prompt as one prefill chunk and the context take
    fits = min(cfg.max_num_batched_tokens, cfg.max_model_len - 2) - 1
    # sampled, not greedy: greedy sampling never reads top_p or the seeds
    sp = SamplingParams(max_tokens=2, temperature=0.8, top_p=0.9, seed=1)
    seq = e.add_request(e.tokenizer.encode(PROMPT)[:fits], sp)
    while e.has_unfinished():
        e.step()
    return list(seq.completion_ids)


def main(argv: list[str]) -> None:
    config, mode, store = argv
    plugins.register()  # what the config may name (kv_memory="elastic")
    e = LLMEngine(EngineConfig(**json.loads(config)), store=store or None)
    if e.store_error:
        sys.exit("the weight store was not used: " + e.store_error)
    out: dict[str, Any] = {"graphs": sorted(e.runner.graphs)}
    if mode == "probe":
        out["tokens"] = probe(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
