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
collectives fail on their own within the same timeout; a write to a rank whose input stays full
for the timeout fails the same way. The communicator's id goes to the followers over the pipe,
never on a command line another user could read.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
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

    def __init__(
        self, rank: int, size: int, uid: bytes, config: EngineConfig, work: Path, timeout: float,
        restore: dict[str, Any], device: dict[str, str],
    ) -> None:  # fmt: skip
        """device: what puts the rank on its own device (medusa.engine.rank_devices)."""
        from medusa.child import python_module, tied_to_this_process

        self.rank, self.log, self.timeout = rank, work / f"rank{rank}.log", timeout
        child_env = tied_to_this_process({**os.environ, **device})
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                python_module("medusa.serve.tensor_parallel"), env=child_env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            )  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.fd = self.proc.stdin.fileno()
        os.set_blocking(self.fd, False)  # NOTE: a stopped rank's full pipe must not block us
        self.ready = threading.Event()
        self.pong = 0  # the last heartbeat it answered
        self.restore_error: str | None = None  # why it did not restore (its "ready" line)
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        self.send({"rank": rank, "size": size, "uid": uid.hex(),
                   "config": dataclasses.asdict(config), "restore": restore})  # fmt: skip

    def _read(self, out: IO[bytes]) -> None:
        for raw in out:
            line = raw.decode(errors="replace")
            if line.startswith("ready"):
                self.restore_error = json.loads(line[5:] or "{}").get("restore_error")
                self.ready.set()
            elif line.startswith("pong "):
                self.pong = int(line.split()[1])

    def send(self, msg: dict[str, Any]) -> None:
        """One line to the rank; RankFailed if it exited or its input stays full for the
        timeout (a stopped rank)."""
        data = (json.dumps(msg) + "\n").encode()
        deadline = time.monotonic() + self.timeout
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self.fd], [], left)[1]:
                raise RankFailed(self.gone())
            try:
                data = data[os.write(self.fd, data) :]
            except BlockingIOError:
                continue
            except OSError:
                raise RankFailed(self.gone()) from None

    def gone(self) -> str:
        code = self.proc.poll()
        how = f"exited with {code}" if code is not None else "stopped answering"
        try:
            tail = self.log.read_text(errors="replace")[-800:].strip()
        except OSError:
            tail = ""
        return (f"tensor-parallel rank {self.rank} (pid {self.proc.pid}) {how}"
                + (f"; its log ends: {tail}" if tail else ""))  # fmt: skip

    def stop(self) -> None:
        """Ends its input (the rank stops at EOF)."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass


class TPLeader:
    """Rank 0: its engine, and every call that changes it sent to the followers first. Reads
    pass through to the engine. A follower found gone while sending fails the next step (or idle
    poll), where AsyncEngine tells every request and /health."""

    idle_work = "watching the tensor-parallel ranks"  # what AsyncEngine says if poll_idle fails

    def __init__(
        self, config: EngineConfig, size: int, on_stage: Any = None, **restore: Any
    ) -> None:
        """restore: LLMEngine's artifact, require_artifact, validate and trust, for every rank
        (each restores its own plan from the artifact; medusa.engine.startup_restore)."""
        from medusa.cuda import load_backend
        from medusa.cuda.nccl import Nccl
        from medusa.engine.rank_devices import rank_envs
        from medusa.engine.tensor_parallel import TPRank

        self.timeout = float(env.NCCL_TIMEOUT.get())
        backend = load_backend()
        # NOTE: each follower its own device; this process keeps the group's list and uses its
        # first entry (device ordinal 0): its driver is initialised already (rank_devices).
        devices = rank_envs(size, backend.kind, os.environ, backend.device_count)
        uid = Nccl(backend).unique_id()
        self.scratch = scratch.ScratchDir("medusa-tp-")  # 0700; a killed leader's: swept
        self.followers: list[_Follower] = []
        self.failed: RankFailed | None = None
        try:
            for r in range(1, size):
                self.followers.append(_Follower(r, size, uid, config, self.scratch.path,
                                                self.timeout, restore, devices[r]))  # fmt: skip
            self.engine = LLMEngine(config, on_stage=on_stage,
                                    tensor_parallel=TPRank(0, size, uid), **restore)  # fmt: skip
            self._wait_ready()
            for f in self.followers:  # NOTE: its log goes with it: its reason goes to ours
                if f.restore_error is not None:
                    log.warning("tensor-parallel rank %d did not restore: %s", f.rank,
                                f.restore_error)  # fmt: skip
        except BaseException:
            self.close()
            raise
        self._ping = (0, time.monotonic())  # the last heartbeat sent, and when
        self._checked = 0.0
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
        if self.failed is not None:
            return
        try:
            for f in self.followers:
                if f.proc.poll() is not None:
                    raise RankFailed(f.gone())
                f.send(msg)
        except RankFailed as e:
            self.failed = e  # NOTE: raised by the next step or idle poll, not in the middle of
            # AsyncEngine's bookkeeping

    def _raise_failed(self) -> None:
        if self.failed is not None:
            raise self.failed

    def add_request(self, prompt: list[int], params: SamplingParams) -> Sequence:
        seq = self.engine.add_request(prompt, params)
        fields = {**dataclasses.asdict(params), "seed": seq.seed}
        self._send({"op": "add", "id": seq.seq_id, "prompt": prompt, "params": fields})
        return seq

    def abort(self, seq: Sequence) -> None:
        if seq.status.name != "FINISHED":  # NOTE: a follower has dropped a finished one
            self._send({"op": "abort", "id": seq.seq_id})
        self.engine.abort(seq)

    def add_hook(self, hook: Any) -> None:
        from medusa.engine.tensor_parallel import TensorParallelError

        raise TensorParallelError(
            f"{type(hook).__name__}: a step hook would run on rank 0 only; tensor-parallel "
            "engines take none (Weaver included)"
        )

    def step(self) -> list[StepOutput]:
        self._raise_failed()
        self._send({"op": "step"})
        self._raise_failed()
        return self.engine.step()

    @property
    def polls_when_idle(self) -> bool:
        return True  # the heartbeats

    def poll_idle(self) -> None:
        """While idle, at most every 0.1 s: a heartbeat each second; a follower that exited,
        or left the last one unanswered for the timeout, fails the engine (RankFailed)."""
        now = time.monotonic()
        if now - self._checked < 0.1:
            return
        self._checked = now
        self._raise_failed()
        n, sent = self._ping
        for f in self.followers:
            if f.proc.poll() is not None or (f.pong < n and now - sent > self.timeout):
                raise RankFailed(f.gone())
        if now - sent >= HEARTBEAT and all(f.pong >= n for f in self.followers):
            self._ping = (n + 1, now)
            self._send({"op": "ping", "n": n + 1})
        self.engine.poll_idle()

    def shutdown(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            self.close()

    def close(self) -> None:
        """Ends every follower (EOF on its input; killed past a shared deadline) and removes
        their logs."""
        for f in self.followers:
            f.stop()
        deadline = time.monotonic() + 10
        for f in self.followers:
            try:
                f.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                f.proc.kill()
                f.proc.wait()
        self.scratch.close()


def follow() -> None:
    """A follower rank: its engine, then every call rank 0 sends, until stop or EOF."""
    from medusa.child import die_with_parent, exit_on_sigterm
    from medusa.engine.tensor_parallel import TPRank

    die_with_parent()
    exit_on_sigterm()  # NOTE: the parent's death signal: what this rank made in /tmp goes too
    first = json.loads(sys.stdin.readline())
    cfg = first["config"]
    config = EngineConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})
    tp = TPRank(int(first["rank"]), int(first["size"]), bytes.fromhex(first["uid"]))
    engine = LLMEngine(config, tensor_parallel=tp, **first["restore"])
    print("ready", json.dumps({"restore_error": engine.restore_error}), flush=True)
    seqs: dict[int, Sequence] = {}
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg["op"]
        if op == "add":
            p = msg["params"]
            params = SamplingParams(**{**p, "stop": tuple(p["stop"])})
            seqs[msg["id"]] = engine.add_request(msg["prompt"], params)
        elif op == "abort":
            seq = seqs.pop(msg["id"], None)
            if seq is not None:  # NOTE: finished here in the step rank 0 aborted it after
                engine.abort(seq)
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
