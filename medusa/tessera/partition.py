"""`medusa run --partition PLAN`: the reference engine serving with its decode graphs split across
two simcuda processes by a placement file (`medusa tessera place`).

The serving process is device 0: it runs the engine (scheduler, prefill, sampling's host side)
and the KV cache's kernels. It starts a follower, device 1: another process restored from the
same artifact, which runs no engine, only its segments of whichever decode graph the server
launches. Each step the server sends the graph's index and what device 1 reads that the host
wrote (executor.PartitionedGraph with host_inputs); the two then take turns through the graph
and device 1's last writes come back. A follower that goes away, or does not answer within
`--partition-timeout` seconds (stopped, hung), ends the server's step with an error naming it:
the engine fails, its requests get 503 and /health reports it, so a gateway replaces the worker.
What either side receives is written only where the plan expects it (executor.PartitionedGraph).
The link is a Unix socket in a directory of this user's only (mkdtemp, 0700).

A placement file (JSON) names the artifact it was made for (the sha256 of its manifest), the
instrumented recording of the same start-up its accesses come from (a path relative to the
file), and one device per kernel node of every decode graph."""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medusa import scratch
from medusa.errors import RefusedError
from medusa.progress import Progress

FORMAT = "medusa-tessera-placement/1"
TIMEOUT = 10.0  # seconds the follower may take within a step (a decode step takes milliseconds)
log = logging.getLogger("medusa.tessera")


class PartitionError(RefusedError, ValueError):
    """The placement file cannot be used with this artifact; the message says why and what to do."""


@dataclass(frozen=True)
class Placement:
    path: Path
    artifact_sha256: str
    accesses: Path
    graphs: list[list[int]]
    how: str

    def write(self) -> None:
        body = {"format": FORMAT, "artifact_sha256": self.artifact_sha256, "how": self.how,
                "accesses": os.path.relpath(self.accesses, self.path.parent),
                "graphs": self.graphs}  # fmt: skip
        self.path.write_text(json.dumps(body) + "\n")


def manifest_sha256(artifact: str | Path) -> str:
    return hashlib.sha256((Path(artifact) / "manifest.json").read_bytes()).hexdigest()


def _remake(path: Path, artifact: str | Path) -> str:
    return f"make it again with `medusa tessera place {artifact} --out {path}`"


def load_placement(path: str | Path, artifact: str | Path, nodes: list[int]) -> Placement:
    """Reads PLAN and checks it against the artifact whose decode graphs have `nodes` nodes."""
    path = Path(path)
    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PartitionError(f"--partition {path}: not a readable placement file ({e}); "
                             f"{_remake(path, artifact)}") from None  # fmt: skip
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise PartitionError(f"--partition {path}: not a {FORMAT} file; {_remake(path, artifact)}")
    if body.get("artifact_sha256") != manifest_sha256(artifact):
        raise PartitionError(f"--partition {path}: made for another artifact than {artifact} "
                             f"(its manifest differs); {_remake(path, artifact)}")  # fmt: skip
    graphs = body.get("graphs")
    if (
        not isinstance(graphs, list)
        or [len(g) if isinstance(g, list) else -1 for g in graphs] != nodes
        or any(d not in (0, 1) for g in graphs for d in g)
    ):
        raise PartitionError(f"--partition {path}: needs device 0 or 1 for each node of "
                             f"{len(nodes)} decode graphs of {nodes} nodes; "
                             f"{_remake(path, artifact)}")  # fmt: skip
    accesses = path.parent / str(body.get("accesses", ""))
    if not accesses.is_file():
        raise PartitionError(f"--partition {path}: its access recording {accesses} is missing; "
                             f"{_remake(path, artifact)}")  # fmt: skip
    return Placement(path, body["artifact_sha256"], accesses, graphs, str(body.get("how", "")))


def make_placement(
    artifact: str | Path, out: str | Path, how: str, seed: int = 0, progress: Progress | None = None
) -> Placement:
    """Records the artifact's start-up with accesses on (next to OUT) and places its decode
    graphs' nodes: `half` (each graph's first half on device 0, the rest on device 1) or
    `random`. The KV cache's kernels are moved to device 0 when the placement is used.
    progress: where its two long steps show (none by default)."""
    import random

    from medusa.artifact.store import load_artifact
    from medusa.engine.config import EngineConfig
    from medusa.tessera.accesses import analyze
    from medusa.tessera.record import record_instrumented
    from medusa.trace import read_trace
    from medusa.trace.run_view import RunView

    out = Path(out)
    manifest = load_artifact(Path(artifact)).manifest
    trace = out.with_name(out.name + ".accesses.mtr")
    steps = progress or Progress(quiet=True)
    with steps.step("recording the start-up and graph replays with kernel accesses on"):
        record_instrumented(EngineConfig(**manifest["engine"]), trace)
    with steps.step("analyzing the decode graphs' accesses"):
        nodes = [len(rows) for rows in analyze(RunView.build(read_trace(trace)))]
    rng = random.Random(seed)
    if how == "half":
        graphs = [[int(i >= n // 2) for i in range(n)] for n in nodes]
    elif how == "random":
        graphs = [[rng.randrange(2) for _ in range(n)] for n in nodes]
    else:
        raise ValueError(f"placement {how!r}: use 'half' or 'random'")
    p = Placement(out, manifest_sha256(artifact), trace, graphs, how)
    p.write()
    return p


class Leader:
    """Device 0's side in the serving process: the follower, and the engine's decode graphs
    replaced by their split versions."""

    def __init__(
        self, engine: Any, artifact: str | Path, plan: str | Path, timeout: float = TIMEOUT
    ) -> None:
        """timeout: seconds the follower may take to answer within a step (a stopped or hung
        follower then fails the step, and the engine, with an error naming it)."""
        from medusa.tessera.executor import Accesses, Link, PartitionedGraph
        from medusa.trace import read_trace
        from medusa.trace.run_view import RunView

        if engine.restorer is None:
            raise PartitionError(f"--partition {plan}: the engine was not restored from "
                                 f"{artifact} (see the log); nothing to split")  # fmt: skip
        sizes = engine.restorer.art.manifest["graphs"]["keys"]
        nodes = _graph_nodes(engine.restorer.plan)
        placement = load_placement(plan, artifact, nodes)
        accesses = Accesses.of(RunView.build(read_trace(placement.accesses)), engine.restorer)
        if [len(g) for g in accesses.graphs] != nodes:
            raise PartitionError(f"--partition {plan}: its access recording is of other graphs "
                                 f"than {artifact}'s; {_remake(Path(plan), artifact)}")  # fmt: skip
        self.scratch = scratch.ScratchDir("medusa-partition-")  # (a killed leader's: swept)
        self.dir = self.scratch.path
        sock = self.dir / "exchange.sock"
        self.follower = _start_follower(artifact, plan, sock, self.dir)
        deadline = time.monotonic() + 120
        while not sock.exists():
            if self.follower.poll() is not None or time.monotonic() > deadline:
                raise PartitionError(f"--partition {plan}: the follower (device 1) did not start "
                                     f"(see its log {self.dir / 'follower.log'})")  # fmt: skip
            time.sleep(0.05)
        self.timeout = timeout
        self.link = Link(sock, 1, timeout=timeout)  # NOTE: Link's rank 1 connects
        graphs = dict(engine.runner.graphs)
        self.split: dict[int, tuple[int, Any]] = {}
        for gi, size in enumerate(sizes):
            pg = PartitionedGraph(engine.restorer, gi, accesses, placement.graphs[gi], 0,
                                  self.link, engine.device.stream, 0, host_inputs=True)  # fmt: skip
            self.split[graphs[size]] = (gi, pg)
        self.segments = [len(pg.segments) for _, pg in self.split.values()]
        self.steps = 0
        self.plain = engine.runner.dev.replay
        engine.runner.dev.replay = self.replay
        atexit.register(self.close)
        log.info("tessera: decode graphs split by %s over this process and follower pid %d "
                 "(%s segments)", plan, self.follower.pid, self.segments)  # fmt: skip

    def replay(self, exec_: int) -> None:
        if exec_ not in self.split:  # a prefill graph: whole, here, as eager prefill ran
            self.plain(exec_)
            return
        gi, pg = self.split[exec_]
        try:
            self.link.send(gi)
            pg.run()
        except TimeoutError:
            raise RuntimeError(
                f"the partition's follower (device 1, pid {self.follower.pid}) did not answer "
                f"in {self.timeout:g} s (--partition-timeout): stopped or hung; its log: "
                f"{self.dir / 'follower.log'}"
            ) from None
        except (ConnectionError, OSError) as e:
            raise RuntimeError(
                f"the partition's follower (device 1, pid {self.follower.pid}) went away: {e}; "
                f"its log: {self.dir / 'follower.log'}"
            ) from None
        self.steps += 1

    def close(self) -> None:
        """Ends the follower (it exits when the exchange closes) and removes its files."""
        self.link.close()
        try:
            self.follower.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.follower.kill()
            self.follower.wait()
        log.info("tessera: %d decode steps split over two processes", self.steps)
        self.scratch.close()


def _graph_nodes(plan: dict) -> list[int]:  # type: ignore[type-arg]
    """The kernel nodes of each graph of a restore plan."""
    import numpy as np

    from medusa.artifact.layout import NODE

    return [len(np.frombuffer(plan["templates"][g["template"]]["nodes"], NODE))
            for g in plan["graphs"]]  # fmt: skip


def _start_follower(artifact: str | Path, plan: str | Path, sock: Path, work: Path) -> Any:
    from medusa.child import python_module, tied_to_this_process
    from medusa.trace import recorder_env

    env = recorder_env(work / "follower-%p.mtr", mode="restore")
    cmd = python_module("medusa.tessera.partition", str(artifact), str(plan), str(sock))
    log = (work / "follower.log").open("w")
    return subprocess.Popen(cmd, env=tied_to_this_process(env), stdout=log, stderr=log)


def follow(artifact: str, plan: str, sock: str) -> None:
    """Device 1: restore the artifact, then run this side of each graph the server launches,
    until the server goes away."""
    from medusa import plugins
    from medusa.artifact.store import load_artifact
    from medusa.child import die_with_parent
    from medusa.engine.config import EngineConfig
    from medusa.engine.llm_engine import LLMEngine
    from medusa.tessera.executor import Accesses, Link, PartitionedGraph
    from medusa.trace import read_trace
    from medusa.trace.run_view import RunView

    die_with_parent()
    plugins.register()  # what the artifact's engine config may name
    manifest = load_artifact(Path(artifact)).manifest
    e = LLMEngine(EngineConfig(**manifest["engine"]), artifact=artifact, require_artifact=True)
    assert e.restorer is not None
    # NOTE: this side replays graph segments itself, never through runner.execute, which waits
    # for a store's weights (serve while loading): wait for them all here.
    e.runner.settle_weights()
    nodes = _graph_nodes(e.restorer.plan)
    placement = load_placement(plan, artifact, nodes)
    accesses = Accesses.of(RunView.build(read_trace(placement.accesses)), e.restorer)
    link = Link(sock, 0, timeout=600)  # NOTE: it listens (it is ready last); the server connects
    link.sock.settimeout(None)  # a server may stay idle for long between steps
    decode = len(e.restorer.art.manifest["graphs"]["keys"])  # NOTE: prefill graphs run whole
    graphs = [PartitionedGraph(e.restorer, gi, accesses, placement.graphs[gi], 1, link,
                               e.device.stream, 0, host_inputs=True)
              for gi in range(decode)]  # fmt: skip
    print(f"follower ready: {[len(g.segments) for g in graphs]} segments", flush=True)
    while True:
        try:
            gi = link.recv()
        except (ConnectionError, OSError):
            return  # the server stopped
        if not isinstance(gi, int) or not 0 <= gi < len(graphs):
            raise SystemExit(f"follower: the server asked for graph {gi!r} of {len(graphs)}")
        graphs[gi].run()


if __name__ == "__main__":
    follow(*sys.argv[1:4])
