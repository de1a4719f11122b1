"""A cold model's engine for the tests: it starts, becomes the receiver of the region, waits for the
hot engine's first task (so that its own requests run while it serves), generates greedily for
its own prompts polling between its kernels, serves until the hot engine stops the pairing, and
prints its completions' token ids as JSON. `--elastic`: its KV (and so the receiver's) is elastic,
from MEDUSA_KV_LEDGER's ledger; `--hold`: it waits for a line on stdin before it exits (its ledger
row stays while the test looks)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from medusa import plugins
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.weaver.cold import ColdWeaving
from medusa.weaver.region import TASK

COLD_PROMPTS = [[5, 6, 7, 8, 9], [40, 41], [100, 3, 100, 3, 7, 7, 1]]
COLD_TOKENS = 12


def cold_config(model: str, kv_memory: str = "static") -> EngineConfig:
    return EngineConfig(model=model, max_num_seqs=4, max_model_len=128, kv_memory=kv_memory,
                        max_num_batched_tokens=128, kv_cache_memory=4 << 20)  # fmt: skip


def generate(engine: LLMEngine, weaving: ColdWeaving | None) -> list[list[int]]:
    params = SamplingParams(max_tokens=COLD_TOKENS, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in COLD_PROMPTS]
    if weaving is not None:
        weaving.run()  # returns when the hot engine stops the pairing
    while engine.has_unfinished():
        engine.step()
    return [s.completion_ids for s in seqs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("region")
    ap.add_argument("model")
    ap.add_argument("--blocks", type=int, default=96)
    ap.add_argument("--elastic", action="store_true")
    ap.add_argument("--hold", action="store_true")
    args = ap.parse_args()
    plugins.register()  # --elastic
    engine = LLMEngine(cold_config(args.model, "elastic" if args.elastic else "static"))
    weaving = ColdWeaving(engine, args.region, args.blocks, block_size=4)
    deadline = time.monotonic() + 60
    while weaving.region.counter(TASK) == 0 and not weaving.stopped and time.monotonic() < deadline:
        weaving.device.poll()
        time.sleep(1e-3)
    out = generate(engine, weaving)
    served = weaving.receiver.served
    weaving.close()
    print(json.dumps({"tokens": out, "served": served}), flush=True)
    if args.hold:
        sys.stdin.readline()
    engine.shutdown()


if __name__ == "__main__":
    main()
