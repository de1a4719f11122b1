"""One of the two devices of a partitioned decode check: restores the artifact once per request
group (`--groups`, default 1), decodes each group greedily on its own graphs (the one-device
reference), then again for each of `--placements` random kernel-to-device placements (the same in
both processes: one seed; the KV cache's kernels on a random device), every decode graph split
across the two processes (medusa.tessera.executor), the groups pipelined across the devices
(medusa.tessera.pipeline); prints, as JSON, the placements where some group's tokens differ from
its reference. With `--compare N`, instead: one placement (each graph's nodes before a cut on
device 0, the rest and the KV cache's kernels on device 1, balanced by the bytes each device's
kernels touch) run N times each way, the groups one
after another and pipelined, alternating; the JSON gives decode steps per second of each. Run
two, rank 0 first:
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
from pathlib import Path
from typing import Any

from medusa import plugins
from medusa.artifact.store import load_artifact
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine
from medusa.engine.sampling import SamplingParams
from medusa.tessera.accesses import Key
from medusa.tessera.executor import Accesses, Extents, Link, PartitionedGraph
from medusa.tessera.pipeline import Mux, Turn, run_groups, trace_position
from medusa.trace import read_trace
from medusa.trace.run_view import RunView

PROMPTS = [[5, 17, 42, 7, 99, 3], [11, 12, 13]]  # two sequences: the batch-2 graph runs too


def prompts(group: int) -> list[list[int]]:
    """Each group its own prompts (group 0: PROMPTS)."""
    return [[t + 3 * group for t in p] for p in PROMPTS]


def decode(e: LLMEngine, group: int, max_tokens: int) -> list[list[int]]:
    seqs = [e.add_request(p, SamplingParams(max_tokens=max_tokens)) for p in prompts(group)]
    while e.has_unfinished():
        e.step()
    return [s.completion_ids for s in seqs]


class Side:
    """This process: one engine per group (sharing the process's device), their accesses."""

    def __init__(self, artifact: str, trace: str, groups: int) -> None:
        manifest = load_artifact(Path(artifact)).manifest
        config = EngineConfig(**manifest["engine"])
        self.engines = [LLMEngine(config, artifact=artifact, require_artifact=True)]
        for _ in range(1, groups):
            self.engines.append(LLMEngine(
                config, artifact=artifact, require_artifact=True,
                device=self.engines[0].device, restore_since=trace_position(),
            ))  # fmt: skip
        view = RunView.build(read_trace(trace))
        self.accesses = [Accesses.of(view, e.restorer) for e in self.engines]  # type: ignore[arg-type]
        self.sizes = manifest["graphs"]["keys"]
        self.dev = self.engines[0].runner.dev
        self.plain = self.dev.replay
        self.steps = 0

    def split(
        self, placements: list[list[int]], pin: int, rank: int, mux: Mux, max_nodes: int = 0
    ) -> int:
        """Every group's decode graphs split by `placements` (one per graph); returns the
        segments per graph."""
        table: dict[int, PartitionedGraph] = {}
        for g, e in enumerate(self.engines):
            graphs = dict(e.runner.graphs)
            for gi, size in enumerate(self.sizes):
                table[graphs[size]] = PartitionedGraph(
                    e.restorer, gi, self.accesses[g], placements[gi], rank, mux.channel(g),  # type: ignore[arg-type]
                    e.device.stream, pin, max_nodes=max_nodes,
                )  # fmt: skip

        def replay(exec_: int) -> None:
            if exec_ not in table:  # a prefill graph: whole, on this device
                self.plain(exec_)
                return
            self.steps += 1
            table[exec_].run()

        self.dev.replay = replay  # type: ignore[method-assign]
        return sum(len(p.segments) for p in table.values()) // len(self.engines)

    def counted(self, exec_: int) -> None:
        """The graph, unsplit (one device), counted."""
        self.steps += 1
        self.plain(exec_)

    def unsplit(self) -> None:
        self.dev.replay = self.plain  # type: ignore[method-assign]

    def work(self, tokens: int) -> list[Any]:
        return [lambda g=g, e=e: decode(e, g, tokens) for g, e in enumerate(self.engines)]


def main() -> None:
    plugins.register()  # what the artifact's engine config may name
    ap = argparse.ArgumentParser(prog="python -m medusa.tessera.partition_check")
    ap.add_argument("artifact")
    ap.add_argument("trace")
    ap.add_argument("rank", type=int)
    ap.add_argument("socket")
    ap.add_argument("--placements", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--groups", type=int, default=1, help="request groups in flight")
    ap.add_argument(
        "--compare", type=int, default=0, metavar="N",
        help="time one placement N times unpipelined and pipelined instead",
    )  # fmt: skip
    ap.add_argument("--max-segment", type=int, default=0,
                    help="at most this many nodes per segment (0: no limit)")  # fmt: skip
    a = ap.parse_args()
    side = Side(a.artifact, a.trace, a.groups)
    # One device's tokens for every group (the first engine's), and each group's own engine alone
    reference = [decode(side.engines[0], g, a.tokens) for g in range(a.groups)]
    alone = [decode(e, g, a.tokens) for g, e in enumerate(side.engines)]
    turn = Turn()
    mux = Mux(Link(a.socket, a.rank), a.groups, turn)
    out: dict[str, Any] = {"reference": reference, "groups": a.groups, "alone": alone == reference}
    if a.compare:
        out.update(compare(side, a, mux, turn, reference))
    else:
        out.update(check(side, a, mux, turn, reference))
    mux.close()
    print(json.dumps(out))


def check(side: Side, a: argparse.Namespace, mux: Mux, turn: Turn, reference: list) -> dict:  # type: ignore[type-arg]
    rng = random.Random(a.seed)
    bad, segments, t0, turn.interleaved = [], 0, time.perf_counter(), 0
    for p in range(a.placements):
        pin = rng.randrange(2)  # the device the KV cache lives on
        placements = [[rng.randrange(2) for _ in rows] for rows in side.accesses[0].graphs]
        segments += side.split(placements, pin, a.rank, mux, a.max_segment)
        got = run_groups(side.work(a.tokens), turn, pipelined=a.groups > 1)
        side.unsplit()
        if got != reference:
            bad.append({"placement": p, "tokens": got})
    return {"placements": a.placements, "bad": bad, "seconds": time.perf_counter() - t0,
            "interleaved": turn.interleaved,
            "segments": segments / max(1, a.placements * len(side.sizes))}  # fmt: skip


def balanced(rows: list[Extents], dynamic: set[Key]) -> list[int]:
    """Nodes before a cut on device 0, the rest and the KV cache's kernels on device 1, the cut
    where the bytes each device's kernels touch (decode is memory-bound) are closest."""
    cost = [sum(hi - lo for ext in e.values() for lo, hi, _ in ext) for e in rows]
    pinned = [bool(dynamic & set(e)) for e in rows]
    total, best = sum(cost), (float("inf"), 0)
    first = 0.0  # device 0's bytes with the cut at c
    for c in range(len(rows) + 1):
        best = min(best, (abs(total - 2 * first), c))
        if c < len(rows) and not pinned[c]:
            first += cost[c]
    return [int(n >= best[1]) for n in range(len(rows))]


def compare(side: Side, a: argparse.Namespace, mux: Mux, turn: Turn, reference: list) -> dict:  # type: ignore[type-arg]
    side.steps, t0 = 0, time.perf_counter()
    side.dev.replay = side.counted  # type: ignore[method-assign]
    run_groups(side.work(a.tokens), turn, pipelined=False)
    alone = side.steps / (time.perf_counter() - t0)  # one device, every group, unsplit
    acc = side.accesses[0]
    placements = [balanced(rows, acc.dynamic) for rows in acc.graphs]
    segments = side.split(placements, 1, a.rank, mux, a.max_segment)
    rates: dict[str, list[float]] = {"unpipelined": [], "pipelined": []}
    busy: dict[str, list[float]] = {"unpipelined": [], "pipelined": []}
    same = True
    for _ in range(a.compare):
        for mode in rates:
            side.steps, t0, c0 = 0, time.perf_counter(), time.process_time()
            got = run_groups(side.work(a.tokens), turn, pipelined=mode == "pipelined")
            wall = time.perf_counter() - t0
            rates[mode].append(side.steps / wall)
            busy[mode].append((time.process_time() - c0) / wall)  # this device's CPU share
            same = same and got == reference
    side.unsplit()
    return {"segments": segments / len(side.sizes), "steps_per_s": rates, "same": same,
            "one_device_steps_per_s": alone, "busy": busy}  # fmt: skip


if __name__ == "__main__":
    main()
