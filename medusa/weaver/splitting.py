"""The receiver's head-of-line blocking and the operator splitting that bounds it (Weaver §4.3).

A hot worker posts an offloaded attention task at the start of its own attention, which takes K;
the receiver takes the task at its next operator boundary and runs it in N; the sender waits for
the result only past K. Say the task arrives while the receiver runs operator i of length T_i and
the arrival point is uniform in that operator, so the time left R ~ U(0, T_i). The result is
ready at R + N and the sender waits max(R + N - K, 0). With slack s = K - N:

    E[wait_i] = 1/T_i * integral_0^T_i max(r - s, 0) dr
              = (T_i - s)^2 / (2 T_i)    for 0 <= s < T_i
              = 0                        for s >= T_i
              = T_i / 2 - s              for s < 0 (the offload alone outlasts K).

The paper's W_i = max(T_i - (K - N), 0)^2 / (2 T_i) is the first two lines; for N > K it
overstates the wait by s^2 / (2 T_i), so `expected_wait` uses the exact form. A task arrives in
operator i with probability T_i / sum(T), so the receiver's expected wait per task is
sum(T_i * W_i) / sum(T). Splitting an operator in half turns one T_i into two of T_i / 2: the wait
falls while the slack covers the halves, at the cost of one more launch."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

TARGET = 0.05  # the estimated wait per sender iteration stays under this share of it
MAX_PIECES = 64  # a kernel cut finer than this costs more in launches than it saves


def expected_wait(t_op: float, k: float, n: float) -> float:
    """The sender's expected wait when its task lands uniformly inside a receiver operator of
    length t_op (exact; equals the paper's formula whenever k >= n)."""
    if t_op <= 0:
        return max(n - k, 0.0)
    s = k - n
    if s < 0:
        return t_op / 2 - s
    return max(t_op - s, 0.0) ** 2 / (2 * t_op)


def paper_wait(t_op: float, k: float, n: float) -> float:
    """Weaver's W_i = max(T_i - (K - N), 0)^2 / (2 T_i)."""
    return max(t_op - (k - n), 0.0) ** 2 / (2 * t_op)


def mean_wait(ops: Sequence[float], k: float, n: float) -> float:
    """Expected wait per offloaded task on a receiver running `ops` back to back (a task arrives
    in operator i with probability T_i / sum(T))."""
    total = sum(ops)
    if total <= 0:
        return max(n - k, 0.0)
    return sum(t * expected_wait(t, k, n) for t in ops) / total


def monte_carlo_wait(
    ops: Sequence[float], k: float, n: float, samples: int = 200_000, seed: int = 0
) -> float:
    """The same expectation by sampling: an arrival uniform over the receiver's loop of `ops`
    waits for the end of the operator it lands in, then N, then is compared with K."""
    rng = random.Random(seed)
    ends, acc = [], 0.0
    for t in ops:
        acc += t
        ends.append(acc)
    total, wait = acc, 0.0
    for _ in range(samples):
        at = rng.random() * total
        i = _bisect(ends, at)
        wait += max(ends[i] - at + n - k, 0.0)
    return wait / samples


def _bisect(ends: list[float], at: float) -> int:
    lo, hi = 0, len(ends) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if ends[mid] <= at else (lo, mid)
    return lo


@dataclass(frozen=True)
class Split:
    """The receiver's operators after splitting: `pieces[i]` parts of operator i."""

    times: tuple[float, ...]
    pieces: tuple[int, ...]
    wait: float  # expected wait per offloaded task, seconds

    @property
    def ops(self) -> list[float]:
        return [t / p for t, p in zip(self.times, self.pieces, strict=True) for _ in range(p)]

    @property
    def extra_launches(self) -> int:
        return sum(self.pieces) - len(self.pieces)


def split_operators(
    times: Sequence[float],
    k: float,
    n: float,
    iteration: float,
    tasks_per_iteration: int = 1,
    target: float = TARGET,
) -> Split:
    """Halves the receiver's longest operator until the sender's estimated wait per iteration
    (tasks_per_iteration x the mean wait per task) is below `target` x its iteration time. No
    splitting when the offload alone outlasts that budget (N - K above it: no split can help)."""
    if any(t < 0 for t in times) or iteration <= 0 or tasks_per_iteration < 1:
        raise ValueError(
            f"split_operators: need operator times >= 0, iteration > 0 and tasks >= 1, got "
            f"{list(times)}, {iteration}, {tasks_per_iteration}"
        )
    pieces = [1] * len(times)

    def wait(p: list[int]) -> float:
        return mean_wait([t / q for t, q in zip(times, p, strict=True) for _ in range(q)], k, n)

    current, budget = wait(pieces), target * iteration / tasks_per_iteration
    if max(n - k, 0.0) >= budget:  # the offload alone outlasts the budget: splitting cannot help
        return Split(tuple(times), tuple(pieces), current)
    while times and current >= budget:
        i = max(range(len(times)), key=lambda j: times[j] / pieces[j])
        if pieces[i] >= MAX_PIECES:
            break
        trial = pieces.copy()
        trial[i] *= 2
        after = wait(trial)
        if after >= current:
            break
        pieces, current = trial, after
    return Split(tuple(times), tuple(pieces), current)
