"""The program each recording of `medusa materialize` runs (medusa.engine.materialize starts it):
starts the engine, then writes what its start-up built as JSON: the model, the KV cache, the
captured graphs' keys (decode: batch sizes, prefill: tokens), the stages' timings and the device.

    python -m medusa.engine.startup_report CONFIG OUT STORE [TP]

CONFIG: the EngineConfig as JSON; OUT: the file to write; STORE: a weight store to load the
weights from ("" for the model file). It exits with the reason if the store was not used. TP: a
file (private: it holds the communicator's id) naming this process's rank of a tensor-parallel
group, {"rank": R, "size": N, "uid": HEX}."""

from __future__ import annotations

import json
import sys
from typing import Any

from medusa import plugins
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.tensor_parallel import TPRank
from medusa.restore.compat import device_fingerprint


def report(e: LLMEngine) -> dict[str, Any]:
    kv_cache = e.runner.kv_cache
    assert kv_cache is not None, "a started engine holds its KV cache"
    return {
        "model": {"identity": e.source.identity(), "name": e.spec.name, "path": str(e.source.path)},
        "kv": {
            "num_blocks": e.runner.num_blocks,
            "block_bytes": e.runner.block_bytes,
            **kv_cache.describe(),
            **e.kv_profile,
        },
        "graphs": {
            "keys": sorted(e.runner.graphs, reverse=True),
            "prefill_keys": sorted(e.runner.prefill.graphs, reverse=True),
        },
        "timings": e.timings,
        "device": device_fingerprint(e.device),
    }


def main(argv: list[str]) -> None:
    config, out, store, *tp_file = argv
    plugins.register()  # what the config may name (kv_memory="elastic")
    tp = None
    for path in tp_file:
        with open(path) as f:
            t = json.load(f)
        tp = TPRank(int(t["rank"]), int(t["size"]), bytes.fromhex(t["uid"]))
    e = LLMEngine(EngineConfig(**json.loads(config)), store=store or None, tensor_parallel=tp)
    if e.store_error:
        sys.exit("the weight store was not used: " + e.store_error)
    with open(out, "w") as f:
        json.dump(report(e), f)


if __name__ == "__main__":
    main(sys.argv[1:])
