"""Engine workers sharing one device slice, each in its own process, driven in lockstep: in every
round each worker with work runs one engine step. A round is the unit of simulated time, so a
comparison of KV policies does not depend on how loaded the host's cores are.

The scenario Prism is for: model A serves a short burst and goes idle at round T while model B
surges. Under a static split B never has more than half the slice's KV; with elastic KV and one
page ledger, A's pages go back the moment it idles and B maps them. `run_pair` reports, per round
and worker, what the ledger says next to what the live blocks need, so a caller can check that
they agree at every step. (scripts/bench/prism_kv.py and tests/prism/test_two_workers.py run it.)"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from medusa.prism.ledger import PageLedger
from medusa.progress import Progress

PAGE = 2 << 20  # the VMM granularity of simcuda and of current GPUs


@dataclass(frozen=True)
class Load:
    """Requests of one model: `count` prompts of `prompt` tokens, each generating `tokens`."""

    count: int
    prompt: int
    tokens: int
    at_round: int = 0


@dataclass
class Trace:
    """One worker's rounds: tokens generated, pages mapped and held, and the ledger's view."""

    name: str
    tokens: list[int] = field(default_factory=list)
    mapped: list[int] = field(default_factory=list)
    steps: list[bool] = field(default_factory=list)  # whether it ran a step that round
    mismatches: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def rounds_busy(self, start: int) -> int:
        """Rounds from `start` through the last one in which this worker ran a step."""
        last = max((i for i, s in enumerate(self.steps) if s), default=start - 1)
        return last - start + 1


def _worker(conn: Connection, config: dict[str, Any], ledger: str | None) -> None:
    """A worker process: one engine, answering the parent's commands until "stop"."""
    if ledger:
        os.environ["MEDUSA_KV_LEDGER"] = ledger
    from medusa import plugins
    from medusa.engine.config import EngineConfig
    from medusa.engine.llm_engine import LLMEngine
    from medusa.engine.sampling import SamplingParams

    plugins.register()  # kv_memory="elastic"
    engine = LLMEngine(EngineConfig(**config))
    conn.send("ready")
    while True:
        cmd, arg = conn.recv()
        if cmd == "stop":
            engine.shutdown()
            conn.send("stopped")
            return
        try:
            if cmd == "add":
                load: Load = arg
                params = SamplingParams(max_tokens=load.tokens, ignore_eos=True)
                vocab = engine.spec.vocab_size
                for i in range(load.count):
                    prompt = [(7 * i + j) % (vocab - 2) + 1 for j in range(load.prompt)]
                    engine.add_request(prompt, params)
                conn.send(None)
            elif cmd == "step":
                busy = engine.has_unfinished()
                outs = engine.step() if busy else []
                conn.send({"ran": busy, "tokens": len(outs), **_pages(engine)})
        except Exception:  # NOTE: reported to the parent, which fails the run with it
            conn.send({"error": traceback.format_exc()})


def _pages(engine: Any) -> dict[str, Any]:
    """What the ledger and the pool say against the pages the live blocks touch."""
    kv = engine.runner.kv_cache
    pool = getattr(kv, "pool", None)
    if pool is None:
        return {"mapped": 0, "check": ""}
    s = engine.scheduler
    live = kv.elastic.pages_of([b for q in (*s.running, *s.prefilling) for b in q.block_table])
    held = kv.ledger.held() if kv.ledger else pool.num_held
    bad = []
    if held != len(live) + pool.num_spare:
        bad.append(f"ledger holds {held}, live blocks {len(live)} + spare {pool.num_spare}")
    if pool.num_mapped != len(live):
        bad.append(f"{pool.num_mapped} pages mapped, live blocks touch {len(live)}")
    if kv.ledger and kv.ledger.free() < 0:
        bad.append(f"the ledger is overdrawn by {-kv.ledger.free()} pages")
    return {"mapped": pool.num_mapped, "check": "; ".join(bad)}


class Worker:
    def __init__(self, name: str, config: dict[str, Any], ledger: str | None) -> None:
        ctx = mp.get_context("spawn")  # NOTE: never fork a process that holds a CUDA context
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, config, ledger), daemon=True)
        self.proc.start()
        self.trace = Trace(name)

    def ready(self) -> None:
        if not self.conn.poll(600):
            raise TimeoutError(f"worker {self.trace.name} did not start in 600 s")
        self.conn.recv()

    def add(self, load: Load) -> None:
        self.conn.send(("add", load))
        self.conn.recv()

    def step(self) -> bool:
        self.conn.send(("step", None))
        r = self.conn.recv()
        t = self.trace
        if "error" in r:
            t.errors.append(r["error"])
            return False
        t.steps.append(r["ran"])
        t.tokens.append(r["tokens"])
        t.mapped.append(r["mapped"])
        if r["check"]:
            t.mismatches.append(f"round {len(t.steps) - 1}: {r['check']}")
        return bool(r["ran"])

    def stop(self) -> None:
        self.conn.send(("stop", None))
        self.conn.recv()
        self.proc.join(60)


def run_pair(
    kv_memory: str,
    slice_pages: int,
    loads: dict[str, list[Load]],
    base: dict[str, Any],
    max_rounds: int = 2000,
    progress: Progress | None = None,
) -> list[Trace]:
    """Two (or more) workers on one slice of `slice_pages` pages of KV: "elastic" (each may map
    up to the whole slice, one ledger) or "static" (half each, no ledger). Returns their traces.
    progress: where the start-ups and the rounds show (none by default)."""
    steps = progress or Progress(quiet=True)
    with tempfile.TemporaryDirectory(prefix="medusa-lockstep-") as tmp:
        ledger = None
        share = slice_pages * PAGE
        if kv_memory == "elastic":
            ledger = str(Path(tmp) / "ledger")
            PageLedger.create(ledger, slice_pages, PAGE).close()
        else:
            share //= len(loads)
        workers = [
            Worker(name, {**base, "kv_memory": kv_memory, "kv_cache_memory": share}, ledger)
            for name in loads
        ]
        try:
            with steps.step(f"{kv_memory}: starting {len(workers)} workers"):
                for w in workers:
                    w.ready()
            with steps.step(f"{kv_memory}: stepping the workers in turn"):
                _rounds(workers, loads, max_rounds)
        finally:
            for w in workers:
                if w.proc.is_alive():
                    w.stop()
        return [w.trace for w in workers]


def _rounds(workers: list[Worker], loads: dict[str, list[Load]], max_rounds: int) -> None:
    """Rounds of one step per busy worker, each load added at its round, until all are done."""
    for r in range(max_rounds):
        for w in workers:
            for load in loads[w.trace.name]:
                if load.at_round == r:
                    w.add(load)
        ran = [w.step() for w in workers]
        pending = any(load.at_round > r for ls in loads.values() for load in ls)
        if not any(ran) and not pending:
            break
