"""One rank of a tensor-parallel engine (or the whole model, at 1 rank), for
tests/engine/test_tensor_parallel.py.

  python tp_rank.py UID_HEX NRANKS RANK MODEL OUT_DIR [short] [tp] [artifact=DIR] [validate]

Every rank is given the same prompts (greedy; unless `short`, one longer than a step's token
budget, so its prefill is chunked) and writes OUT_DIR/rank<R>.json: the completions' token
ids, the KV block count, the start-up's timings, and the logits of every step
(OUT_DIR/rank<R>.npy, the first sequence's row). `tp` makes a single process a tensor-parallel
group of one (its collectives run, over one rank). `artifact=DIR` restores the rank from DIR
(run it under the recorder in restore mode); rank<R>.json then says whether it was restored,
and why not, and whether its weights came from its store, and why not.
"""

import json
import sys
from pathlib import Path

import numpy as np

from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.loader import open_model
from medusa.engine.sampling import SamplingParams
from medusa.engine.tensor_parallel import TPRank

uid, n, rank, model, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
if "short" not in sys.argv[6:]:
    PROMPTS.append("Once upon a time " * 12)
cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
                   max_prefill_chunk=64, gpu_memory_utilization=0.3)  # fmt: skip
tp = TPRank(rank, n, bytes.fromhex(uid)) if n > 1 or "tp" in sys.argv[6:] else None
flags = sys.argv[6:]
artifact = next((f.split("=", 1)[1] for f in flags if f.startswith("artifact=")), None)
engine = LLMEngine(cfg, source=open_model(model), tensor_parallel=tp, artifact=artifact,
                   validate="validate" in flags)  # fmt: skip
logits = []
seqs = [engine.add_request(engine.tokenizer.encode(p), SamplingParams(max_tokens=8))
        for p in PROMPTS]  # fmt: skip
while engine.has_unfinished():
    outs = engine.step()
    logits.append(engine.runner.last_logits(1)[0].copy())
result = {
    "tokens": [s.completion_ids for s in seqs],
    "blocks": engine.runner.num_blocks,
    "heads": [engine.runner.spec.num_heads, engine.runner.spec.num_kv_heads],
    "timings": {k: round(v, 2) for k, v in engine.timings.items()},
    "restored": engine.restored,
    "restore_error": engine.restore_error,
    "store": engine.store is not None,  # the weights came from the artifact's store
    "store_error": engine.store_error,
}
engine.shutdown()
Path(out, f"rank{rank}.json").write_text(json.dumps(result))
np.save(Path(out, f"rank{rank}.npy"), np.stack(logits))
