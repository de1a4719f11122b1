"""One of the two devices of a partitioned decode check: restores the artifact, decodes greedily
on its own graphs (the one-device reference), then again for each of `--placements` random
kernel-to-device placements (the same in both processes: one seed; the KV cache's kernels on a
random device), every decode graph split across the two processes (medusa.tessera.executor);
prints, as JSON, the placements whose tokens differ from the reference. Run two, rank 0 first:
  python -m medusa.tessera.partition_check ARTIFACT TRACE 0 SOCKET &
  python -m medusa.tessera.partition_check ARTIFACT TRACE 1 SOCKET
under the recorder in restore mode (the restore maps allocations through it); TRACE is an
instrumented recording of the same start-up (medusa.tessera.record.record_instrumented).
tests/tessera/test_executor.py and scripts/bench/tessera_executor.py run it."""

from __future__ import annotations

import argparse
import json
import random
import time

from medusa.artifact.store import load_artifact
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.materialize.analysis import RunView
from medusa.tessera.executor import Accesses, Link, PartitionedGraph
from medusa.trace import read_trace

PROMPTS = [[5, 17, 42, 7, 99, 3], [11, 12, 13]]  # two sequences: the batch-2 graph runs too


def decode(e: LLMEngine, max_tokens: int) -> list[list[int]]:
    seqs = [e.add_request(p, SamplingParams(max_tokens=max_tokens)) for p in PROMPTS]
    while e.has_unfinished():
        e.step()
    return [s.completion_ids for s in seqs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("trace")
    ap.add_argument("rank", type=int)
    ap.add_argument("socket")
    ap.add_argument("--placements", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=int, default=-1, help="debug: node ONLY alone on device 1")
    a = ap.parse_args()
    manifest = load_artifact(a.artifact).manifest
    e = LLMEngine(EngineConfig(**manifest["engine"]), artifact=a.artifact, require_artifact=True)
    assert e.restorer is not None
    accesses = Accesses.of(RunView.build(read_trace(a.trace)), e.restorer)
    sizes = manifest["graphs"]["keys"]
    reference = decode(e, a.tokens)
    link = Link(a.socket, a.rank)
    rng = random.Random(a.seed)
    replay, graphs = e.runner.dev.replay, dict(e.runner.graphs)
    bad, segments, t0 = [], 0, time.perf_counter()
    for p in range(a.placements):
        split, pin = {}, rng.randrange(2)  # the device the KV cache lives on
        for gi, size in enumerate(sizes):
            placement = [rng.randrange(2) for _ in accesses.graphs[gi]]
            if a.only >= 0:
                placement = [int(i == (a.only + p) % len(placement)) for i in range(len(placement))]
            split[graphs[size]] = PartitionedGraph(
                e.restorer, gi, accesses, placement, a.rank, link, e.device.stream, pin
            )
            segments += len(split[graphs[size]].segments)
        e.runner.dev.replay = lambda exec_, split=split: split[exec_].run()  # type: ignore[method-assign]
        got = decode(e, a.tokens)
        e.runner.dev.replay = replay  # type: ignore[method-assign]
        if got != reference:
            bad.append({"placement": p, "tokens": got})
    link.close()
    print(json.dumps({"reference": reference, "placements": a.placements, "bad": bad,
                      "segments": segments / max(1, a.placements * len(sizes)),
                      "seconds": time.perf_counter() - t0}))  # fmt: skip


if __name__ == "__main__":
    main()
