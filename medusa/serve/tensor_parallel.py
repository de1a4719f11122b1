"""`medusa run --tensor-parallel-size N`: the serving process is rank 0 and serves HTTP; it starts
ranks 1..N-1 as processes of their own (one device each), which follow its steps.

Every rank runs the same engine (medusa.engine.tensor_parallel): the steps meet in the
collectives only if every rank runs the same steps. So rank 0 (TPLeader, in place of its
LLMEngine) sends each follower every call that changes the engine, in order, over the follower's
stdin: a request added (with the seed rank 0 drew), a request aborted, a step. A follower's
reply channel (its stdout) carries only its readiness and the answers to rank 0's heartbeats.

A follower that exits, or that does not answer a heartbeat within the collectives' timeout
(MEDUSA_NCCL_TIMEOUT, default 30 s: a stopped or hung rank), fails rank 0's engine with the
reason: requests get 503 and /health reports it, never a hang with /health ok. During a step the
collectives fail on their own within the same timeout. The communicator's id goes to the
followers over the pipe, never on a command line another user could read.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from medusa import env, scratch
from medusa.engine.config import EngineConfig
from medusa.engine.llm_engine import LLMEngine, StepOutput
from medusa.engine.sampling import SamplingParams
from medusa.engine.sequence import Sequence
from medusa.errors import EngineDeadError

log = logging.getLogger("medusa.serve")
HEARTBEAT = 1.0  # seconds between heartbeats while the engine is idle


class RankFailed(EngineDeadError, RuntimeError):
    """A follower rank exited or stopped answering: the group cannot serve any more."""


class _Follower:
    """A follower rank's process and its two pipes."""

    def __init__(self, rank: int, size: int, uid: bytes, config: EngineConfig, work: Path) -> None:
        from medusa.child import python_module, tied_to_this_process

        self.rank, self.log = rank, work / f"rank{rank}.log"
        child_env = tied_to_this_process(dict(os.environ))
        child_env[env.SIM_DEVICE_INDEX.name] = str(rank)
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                python_module("medusa.serve.tensor_parallel"), env=child_env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            )  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[str] = self.proc.stdin
        first = {"rank": rank, "size": size, "uid": uid.hex(), "config": dataclasses.asdict(config)}
        self.send(first)
        self.ready = threading.Event()
        self.pong = 0  # the last heartbeat it answered
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, out: IO[str]) -> None:
        for line in out:
            if line.startswith("ready"):
                self.ready.set()
            elif line.startswith("pong "):
                self.pong = int(line.split()[1])

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self.stdin.write(json.dumps(msg) + "\n")
            self.stdin.flush()
        except (BrokenPipeError, OSError):
            raise RankFailed(self.gone()) from None

    def gone(self) -> str:
        code = self.proc.poll()
        how = f"exited with {code}" if code is not None else "stopped answering"
        return f"tensor-parallel rank {self.rank} (pid {self.proc.pid}) {how}; its log: {self.log}"


class TPLeader:
    """Rank 0: its engine, and every call that changes it sent to the followers first. Reads
    pass through to the engine."""

    def __init__(self, config: EngineConfig, size: int, on_stage: Any = None) -> None:
        from medusa.cuda import load_backend
        from medusa.cuda.nccl import Nccl
        from medusa.engine.tensor_parallel import TPRank

        self.timeout = float(env.NCCL_TIMEOUT.get())
        uid = Nccl(load_backend()).unique_id()
        self.scratch = scratch.ScratchDir("medusa-tp-")  # 0700; a killed leader's: swept
        self.followers = [_Follower(r, size, uid, config, self.scratch.path)
                          for r in range(1, size)]  # fmt: skip
        try:
            self.engine = LLMEngine(config, on_stage=on_stage,
                                    tensor_parallel=TPRank(0, size, uid))  # fmt: skip
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        self._seqs: dict[int, int] = {}
        self._ping = (0, time.monotonic())  # the last heartbeat sent, and when
        log.info("tensor parallel: rank 0 of %d, followers %s", size,
                 [f.proc.pid for f in self.followers])  # fmt: skip

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        for f in self.followers:
            while not f.ready.wait(0.05):
                if f.proc.poll() is not None or time.monotonic() > deadline:
                    raise RankFailed(f.gone())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def _send(self, msg: dict[str, Any]) -> None:
        for f in self.followers:
            if f.proc.poll() is not None:
                raise RankFailed(f.gone())
            f.send(msg)

    def add_request(self, prompt: list[int], params: SamplingParams) -> Sequence:
        seq = self.engine.add_request(prompt, params)
        fields = {**dataclasses.asdict(params), "seed": seq.seed}
        self._send({"op": "add", "id": seq.seq_id, "prompt": prompt, "params": fields})
        return seq

    def abort(self, seq: Sequence) -> None:
        self._send({"op": "abort", "id": seq.seq_id})
        self.engine.abort(seq)

    def step(self) -> list[StepOutput]:
        self._send({"op": "step"})
        return self.engine.step()

    idle_work = "watching the tensor-parallel ranks"  # what AsyncEngine says if poll_idle fails

    @property
    def polls_when_idle(self) -> bool:
        return True  # the heartbeats

    def poll_idle(self) -> None:
        """While idle: a heartbeat each second; a follower that exited, or left the last one
        unanswered for the timeout, fails the engine (RankFailed)."""
        n, sent = self._ping
        now = time.monotonic()
        late = [f for f in self.followers if f.pong < n and now - sent > self.timeout]
        for f in self.followers:
            if f.proc.poll() is not None or f in late:
                raise RankFailed(f.gone())
        if now - sent >= HEARTBEAT and all(f.pong >= n for f in self.followers):
            self._ping = (n + 1, now)
            self._send({"op": "ping", "n": n + 1})
        self.engine.poll_idle()

    def shutdown(self) -> None:
        try:
            self._send({"op": "stop"})
        except RankFailed:
            pass
        self.engine.shutdown()
        self.close()

    def close(self) -> None:
        for f in self.followers:
            try:
                f.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                f.proc.kill()
                f.proc.wait()
        self.scratch.close()


def follow() -> None:
    """A follower rank: its engine, then every call rank 0 sends, until stop or EOF."""
    from medusa.child import die_with_parent
    from medusa.engine.tensor_parallel import TPRank

    die_with_parent()
    first = json.loads(sys.stdin.readline())
    cfg = first["config"]
    config = EngineConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})
    tp = TPRank(int(first["rank"]), int(first["size"]), bytes.fromhex(first["uid"]))
    engine = LLMEngine(config, tensor_parallel=tp)
    print("ready", flush=True)
    seqs: dict[int, Sequence] = {}
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg["op"]
        if op == "add":
            p = msg["params"]
            params = SamplingParams(**{**p, "stop": tuple(p["stop"])})
            seqs[msg["id"]] = engine.add_request(msg["prompt"], params)
        elif op == "abort":
            engine.abort(seqs.pop(msg["id"]))
        elif op == "step":
            for out in engine.step():
                if out.finished:
                    seqs = {k: s for k, s in seqs.items() if s is not out.seq}
        elif op == "ping":
            print(f"pong {msg['n']}", flush=True)
        elif op == "stop":
            break
    engine.shutdown()


if __name__ == "__main__":
    follow()
