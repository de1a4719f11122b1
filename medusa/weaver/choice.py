"""Which cold worker a hot worker should offload to: the one its tasks would wait least on.

A paired receiver takes a task at its next kernel boundary, so the hot worker waits by the
head-of-line model of medusa.weaver.splitting: with the receiver's kernel times T_i (its
`WeavingProfile.ops`), the hot worker's own attention K and the offloaded attention N, the
expected wait per task is sum(T_i W_i) / sum(T), W_i = max(T_i - (K - N), 0)^2 / (2 T_i) (exact
form for N > K). K and N come from the hot worker's profile: its attention time A over its full
batch, K = (1 - ratio) A here and N = ratio A on the receiver (a device of the same speed).

Candidates whose waits are within `TIE` of the lowest count as tied; among them the one with the
most free memory (for the offloaded KV) goes first. A candidate without a profile (it did not
answer) goes last, by free memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from medusa.weaver.splitting import mean_wait

TIE = 0.05  # waits within 5% (or 1 us) of the lowest are ties
TIE_ABS = 1e-6

W = TypeVar("W")


@dataclass(frozen=True)
class WeavingProfile:
    """A worker's times, measured on its device (medusa.weaver.profile)."""

    ops: tuple[float, ...]  # seconds per kernel of a one-sequence eager decode step
    attention: float  # seconds of one layer's attention at max_num_seqs sequences

    def to_json(self) -> dict[str, Any]:
        return {"ops": list(self.ops), "attention": self.attention}

    @classmethod
    def from_json(cls, raw: Any) -> WeavingProfile:
        """ValueError naming what is wrong if `raw` is not a profile's JSON."""
        try:
            ops = tuple(float(t) for t in raw["ops"])
            attention = float(raw["attention"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a weaving profile needs ops (seconds) and attention: {e!r}") from e
        if not ops or min(ops) < 0 or attention < 0:
            raise ValueError(f"a weaving profile's times must be >= 0 and ops non-empty: {raw!r}")
        return cls(ops, attention)


@dataclass(frozen=True)
class Candidate(Generic[W]):
    worker: W
    profile: WeavingProfile | None  # None: unknown (the worker did not say)
    free_bytes: int


def expected_wait(hot: WeavingProfile, ratio: float, cold: WeavingProfile) -> float:
    """Seconds the hot worker waits per offloaded task on `cold`'s kernels."""
    k, n = (1.0 - ratio) * hot.attention, ratio * hot.attention
    return mean_wait(cold.ops, k, n)


def rank_receivers(
    hot: WeavingProfile | None, ratio: float, candidates: Sequence[Candidate[W]]
) -> list[W]:
    """`candidates`' workers, the one to try first first (see the module's docstring). Without
    the hot worker's profile, by free memory alone."""
    if hot is None:
        return [c.worker for c in sorted(candidates, key=lambda c: -c.free_bytes)]
    waits = {id(c): expected_wait(hot, ratio, c.profile) for c in candidates if c.profile}
    rest = sorted((c for c in candidates if c.profile), key=lambda c: waits[id(c)])
    order: list[Candidate[W]] = []
    while rest:
        best = waits[id(rest[0])]
        tied = [c for c in rest if waits[id(c)] <= best * (1 + TIE) + TIE_ABS]
        order += sorted(tied, key=lambda c: -c.free_bytes)
        rest = rest[len(tied) :]
    order += sorted((c for c in candidates if not c.profile), key=lambda c: -c.free_bytes)
    return [c.worker for c in order]
