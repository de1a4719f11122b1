"""Requests pipelined across the two devices of a partitioned decode (Tessera's executor, issue 21
item 5): while device 0 runs one request group's segment, device 1 runs another's.

Each process holds one engine per group in flight, each restored from the artifact (its own
activations, KV cache and sampled tokens; the second and later restores are matched against
only what the process allocated since: Restorer's `since`). A group is a thread running its own
engine's decode loop, every decode graph split as in `executor.PartitionedGraph`. The process is
one device, so a `Turn` lets one group at a time use it: a group holds the turn throughout, and
gives it up only while it waits for the other device's bytes, which is exactly when another
group's segment can run here. The two processes exchange over one socket, each message tagged
with its group; a reader thread sorts them into per-group queues, so a send never waits on the
other side's reading. Each group's exchange is the unpipelined protocol, in its own order, so a
group's tokens are the ones it gets alone (and one device's)."""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from medusa import env
from medusa.tessera.executor import Link
from medusa.trace import control as trace
from medusa.trace import read_trace


class Turn:
    """The one device of this process: a group uses it only while holding the turn, which goes
    to waiting groups in the order they asked for it; a group gives it up while it waits for the
    other device, and between two of its own segments when another group waits."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._holder: int | None = None
        self._last: int | None = None
        self._queue: deque[int] = deque()
        self.interleaved = 0  # times another group used the device between two of a group's turns

    def take(self, group: int) -> None:
        with self._cv:
            self._queue.append(group)
            self._cv.wait_for(lambda: self._holder is None and self._queue[0] == group)
            self._queue.popleft()
            self._holder = group
            if self._last is not None and self._last != group:
                self.interleaved += 1
            self._last = group

    def give(self) -> None:
        with self._cv:
            self._holder = None
            self._cv.notify_all()

    def waiting(self, group: int, wait: Callable[[], Any]) -> Any:
        """Runs `wait` (a blocking receive) with the turn given up, and takes it back."""
        self.give()
        try:
            return wait()
        finally:
            self.take(group)

    def pass_on(self, group: int) -> None:
        """Between two of a group's segments: the groups waiting go first."""
        with self._cv:
            waiting = bool(self._queue)
        if waiting:
            self.give()
            self.take(group)


class Mux:
    """Per-group channels over one Link: messages are (group, payload)."""

    def __init__(self, link: Link, groups: int, turn: Turn) -> None:
        self.link, self.turn = link, turn
        self._send = threading.Lock()
        self._queues: list[queue.Queue[object]] = [queue.Queue() for _ in range(groups)]
        self.link.sock.settimeout(None)  # NOTE: the reader waits as long as a group computes
        self._reader = threading.Thread(target=self._read, name="tessera-mux", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                msg = self.link.recv()
                assert isinstance(msg, list)
                self._queues[msg[0]].put(msg[1])
        except (ConnectionError, OSError, ValueError) as e:
            for q in self._queues:  # wakes every waiting group: the exchange is over
                q.put(_Closed(str(e)))

    def channel(self, group: int) -> Channel:
        return Channel(self, group)

    def close(self) -> None:
        self.link.close()


class _Closed:
    def __init__(self, why: str) -> None:
        self.why = why


class Channel:
    """What PartitionedGraph needs of a link (send, recv), for one group; a receive gives up the
    device's turn while it waits."""

    def __init__(self, mux: Mux, group: int) -> None:
        self.mux, self.group = mux, group

    def send(self, obj: object) -> None:
        with self.mux._send:
            self.mux.link.send([self.group, obj])

    def pass_on(self) -> None:
        self.mux.turn.pass_on(self.group)

    def recv(self) -> object:
        got = self.mux.turn.waiting(self.group, self.mux._queues[self.group].get)
        if isinstance(got, _Closed):
            raise ConnectionError(f"group {self.group}: the other device's process closed the "
                                  f"exchange ({got.why})")  # fmt: skip
        return got


def run_groups(work: list[Callable[[], Any]], turn: Turn, *, pipelined: bool) -> list[Any]:
    """Runs each group's work (its whole decode) holding the turn: all at once (pipelined, one
    thread per group) or one after another. Returns their results in group order; the first
    failure is raised."""
    results: list[Any] = [None] * len(work)
    errors: list[BaseException] = []

    def one(g: int) -> None:
        turn.take(g)
        try:
            results[g] = work[g]()
        except BaseException as e:  # NOTE: re-raised in the caller's thread
            errors.append(e)
        finally:
            turn.give()

    if not pipelined:
        for g in range(len(work)):
            one(g)
    else:
        threads = [threading.Thread(target=one, args=(g,), name=f"tessera-group{g}")
                   for g in range(len(work))]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return results


def trace_position() -> int:
    """The sequence number of the last record this process's recorder wrote (a later engine's
    restore matches only what came after it)."""
    if not trace.active() or not trace.flush():
        raise RuntimeError("a second engine's restore needs the recorder in restore mode")
    path = (env.TRACE.get() or "").replace("%p", str(os.getpid()))
    seqs = read_trace(path, allow_truncated=True).records["seq"]
    return int(seqs.max()) if len(seqs) else 0
