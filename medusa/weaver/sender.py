"""The sender: the hot worker's side of an exchange region. It posts one layer's offloaded
attention, then waits for the receiver's output, watching the receiver's heartbeat so that a
receiver that died or hangs ends in a clear error naming the sequences to recompute, never in a
hang."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence

import numpy as np

from medusa.errors import FallbackError
from medusa.weaver.region import (
    APPEND,
    ATTEND,
    DONE,
    FAILED,
    FETCH,
    HEARTBEAT,
    OK,
    RECEIVER_PID,
    RELEASE,
    SENDER_PID,
    STATUS,
    STOP,
    TASK,
    ExchangeRegion,
    process_alive,
)

TIMEOUT = 2.0  # seconds without a heartbeat before the receiver counts as lost


class WeaverError(FallbackError, RuntimeError):
    """The receiver refused a task; its message says why."""


class ReceiverLost(FallbackError, RuntimeError):
    """The receiver died or stopped polling. `seq_ids` are the sequences whose KV it held: the
    hot worker must recompute them (prefill again from their tokens) or fail them."""

    def __init__(self, message: str, seq_ids: Iterable[int]) -> None:
        super().__init__(f"{message}; its offloaded sequences {sorted(seq_ids)} must be recomputed")
        self.seq_ids = sorted(seq_ids)


def assign_offload(seq_ids: Sequence[int], ratio: float) -> list[int]:
    """The sequences to offload at `ratio` (fixed after prefill): spread evenly, floor(n x ratio)
    of n, sequence i when floor((i + 1) r) > floor(i r)."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"weaving ratio {ratio}: must be within [0, 1]")
    return [s for i, s in enumerate(seq_ids) if int((i + 1) * ratio) > int(i * ratio)]


class WeaverSender:
    def __init__(self, region: ExchangeRegion, timeout: float = TIMEOUT) -> None:
        self.region, self.timeout = region, timeout
        self.offloaded: set[int] = set()  # sequences whose KV the receiver holds
        self.lengths: dict[int, int] = {}  # their tokens there, as last sent
        region.set_counter(SENDER_PID, os.getpid())
        self._since = time.monotonic_ns()  # a receiver that never started gets `timeout` from now

    def attend(
        self,
        layer: int,
        seq_ids: Sequence[int],
        seq_lens: Sequence[int],
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        query_start: Sequence[int] | None = None,
    ) -> np.ndarray:
        """Appends k/v rows to the receiver's copy of each sequence and returns the attention
        of q over it ([rows, heads * head_dim]); rows query_start[i] .. query_start[i+1] - 1
        belong to seq_ids[i], whose length after the append is seq_lens[i] (default: one row
        each, a decode step)."""
        rows = self._post(ATTEND, layer, seq_ids, seq_lens, {"q": q, "k": k, "v": v}, query_start)
        return self.region.array("out")[:rows].copy()

    def append(
        self,
        layer: int,
        seq_ids: Sequence[int],
        seq_lens: Sequence[int],
        k: np.ndarray,
        v: np.ndarray,
        query_start: Sequence[int] | None = None,
    ) -> None:
        """Appends k/v rows as `attend` does, without attention: hands over KV computed here
        (a prefill's)."""
        self._post(APPEND, layer, seq_ids, seq_lens, {"k": k, "v": v}, query_start)

    def _post(
        self,
        kind: int,
        layer: int,
        seq_ids: Sequence[int],
        seq_lens: Sequence[int],
        arrays: dict[str, np.ndarray],
        query_start: Sequence[int] | None,
    ) -> int:
        r, g = self.region, self.region.geometry
        n, rows = len(seq_ids), len(arrays["k"])
        qs = list(query_start) if query_start is not None else list(range(n + 1))
        if not 0 < n <= g.max_seqs or rows > g.max_tokens or qs[-1] != rows:
            raise ValueError(
                f"attend: {n} sequences and {rows} rows (query_start ends at {qs[-1]}) do not "
                f"fit the region's {g.max_seqs} sequences and {g.max_tokens} rows"
            )
        r.array("seq_ids")[:n] = seq_ids
        r.array("seq_lens")[:n] = seq_lens
        r.array("query_start")[: n + 1] = qs
        for name, a in arrays.items():
            r.array(name)[:rows] = a
        self.offloaded.update(seq_ids)
        self._run(kind, layer, n, rows)
        self.lengths.update(zip(seq_ids, seq_lens, strict=True))
        return rows

    def release(self, seq_ids: Sequence[int]) -> None:
        """The sequences finished: the receiver frees their blocks."""
        ids = [s for s in seq_ids if s in self.offloaded]
        g = self.region.geometry
        for i in range(0, len(ids), g.max_seqs):
            part = ids[i : i + g.max_seqs]
            self.region.array("seq_ids")[: len(part)] = part
            self._run(RELEASE, 0, len(part), 0)
            self.offloaded.difference_update(part)
            for sid in part:
                self.lengths.pop(sid, None)

    def take_back(self, seq_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Hands a sequence back (its receiver scales down or gets busy): its K and V,
        [layers, tokens, kv heads * head_dim] each, then frees it there."""
        r, g = self.region, self.region.geometry
        ks, vs = [], []
        for layer in range(g.num_layers):
            r.array("seq_ids")[0] = seq_id
            self._run(FETCH, layer, 1, 0)
            n = int(r.array("seq_lens")[0])
            if n != self.lengths.get(seq_id):
                raise WeaverError(
                    f"the receiver handed back {n} tokens of sequence {seq_id}, "
                    f"{self.lengths.get(seq_id)} were sent"
                )
            ks.append(r.array("k")[:n].copy())
            vs.append(r.array("v")[:n].copy())
        self.release([seq_id])
        return np.stack(ks), np.stack(vs)

    def stop(self) -> None:
        self._run(STOP, 0, 0, 0)

    def _run(self, kind: int, layer: int, num_seqs: int, num_tokens: int) -> None:
        r = self.region
        r.set_task_head(kind, layer, num_seqs, num_tokens)
        task = r.counter(TASK) + 1
        r.set_counter(TASK, task)
        spins = 0
        while r.counter(DONE) < task:
            spins += 1
            if spins > 64:  # a few µs of spinning, then yield the core
                time.sleep(20e-6)
            if spins % 256 == 0:
                self._check_alive(task)
        if r.counter(STATUS) == FAILED:
            message = r.error()
            r.set_counter(STATUS, OK)
            raise WeaverError(f"the receiver refused the task: {message}")

    def _check_alive(self, task: int) -> None:
        r = self.region
        pid, beat = r.counter(RECEIVER_PID), r.counter(HEARTBEAT)
        if pid and not process_alive(pid):
            lost = f"the receiver (pid {pid}) exited during task {task}"
            raise ReceiverLost(lost, self.offloaded)
        age = (time.monotonic_ns() - max(beat, self._since)) / 1e9
        if age > self.timeout:
            raise ReceiverLost(
                f"the receiver (pid {pid}) has not polled for {age:.1f} s (timeout "
                f"{self.timeout} s)",
                self.offloaded,
            )
