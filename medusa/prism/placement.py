"""Prism's global placement (its Alg. 1): put models where KV memory is least contended.

A device's KV pressure ratio is KVPR = sum over its models of rate / SLO, divided by the memory
its models leave for KV cache (memory minus their weights). Models are placed in decreasing
rate / SLO, each on the device whose KVPR after taking it is lowest among those it fits on; a
model already placed moves only when that lowers the pressure it sees by more than a threshold;
when a device is short of memory, idle models' weights go first, larger SLO first (they can wait
for a reload, which the weight store makes cheap)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from medusa.errors import RefusedError


class PlacementError(RefusedError, ValueError):
    """A model fits on no device (its weights plus its minimum KV)."""


@dataclass(frozen=True)
class ModelLoad:
    name: str
    weight_bytes: int
    rate: float  # requests per second
    slo: float  # TTFT SLO, seconds
    min_kv_bytes: int = 0  # KV a model needs to serve one request at all

    @property
    def urgency(self) -> float:
        return self.rate / self.slo


def kvpr(models: Sequence[ModelLoad], memory: int) -> float:
    """The KV pressure ratio of `models` on a device of `memory` bytes (inf: no KV room)."""
    kv = memory - sum(m.weight_bytes for m in models)
    if kv <= sum(m.min_kv_bytes for m in models):
        return float("inf")
    return sum(m.urgency for m in models) / kv


def place(
    models: Sequence[ModelLoad],
    memory: Sequence[int],
    current: Mapping[str, int] | None = None,
    threshold: float = 0.2,
) -> dict[str, int]:
    """Model name -> device index. With `current`, a placed model keeps its device unless the
    best device's KVPR with it is lower than its current device's by more than `threshold`
    (relative), so placement does not churn on small changes in rates."""
    current = current or {}
    on: list[list[ModelLoad]] = [[] for _ in memory]
    out: dict[str, int] = {}
    for m in sorted(models, key=lambda m: (-m.urgency, m.name)):
        scores = [kvpr([*on[d], m], memory[d]) for d in range(len(memory))]
        best = min(range(len(memory)), key=lambda d: (scores[d], d))
        if scores[best] == float("inf"):
            raise PlacementError(
                f"model {m.name!r} ({m.weight_bytes / 2**30:.1f} GiB of weights) fits on no "
                "device next to the models already placed; add devices or evict models"
            )
        d = best
        old = current.get(m.name)
        if old is not None and old < len(memory) and scores[old] < float("inf"):
            if scores[old] - scores[best] <= threshold * scores[old]:
                d = old
        on[d].append(m)
        out[m.name] = d
    if not current:
        _rebalance(on, memory)
        out = {m.name: d for d in range(len(memory)) for m in on[d]}
    return out


def _rebalance(on: list[list[ModelLoad]], memory: Sequence[int], rounds: int = 64) -> None:
    """Moves or swaps models off the most pressured device while that lowers the higher of the
    two devices' KVPR. The greedy pass places the large, rarely used models last, when memory
    may be left only next to a hot model; this undoes that."""
    for _ in range(rounds):
        scores = [kvpr(ms, memory[d]) for d, ms in enumerate(on)]
        worst = max(range(len(on)), key=lambda d: scores[d])
        best: tuple[float, int, ModelLoad, ModelLoad | None] | None = None
        for other in range(len(on)):
            if other == worst:
                continue
            for m in on[worst]:
                for x in [None, *on[other]]:
                    a = [y for y in on[worst] if y is not m] + ([x] if x else [])
                    b = [y for y in on[other] if y is not x] + [m]
                    peak = max(kvpr(a, memory[worst]), kvpr(b, memory[other]))
                    if peak < scores[worst] * 0.999 and (best is None or peak < best[0]):
                        best = (peak, other, m, x)
        if best is None:
            return
        _, other, m, x = best
        on[worst].remove(m)
        on[other].append(m)
        if x is not None:
            on[other].remove(x)
            on[worst].append(x)


def evict(models: Sequence[ModelLoad], idle: set[str], memory: int, need_bytes: int) -> list[str]:
    """Idle models whose weights to drop from a device holding `models` so that `need_bytes`
    more fit in `memory`: larger SLO first, then larger weights. Empty if nothing need go;
    raises PlacementError if dropping every idle model is not enough."""
    short = sum(m.weight_bytes for m in models) + need_bytes - memory
    if short <= 0:
        return []
    out = []
    for m in sorted(
        (m for m in models if m.name in idle), key=lambda m: (-m.slo, -m.weight_bytes, m.name)
    ):
        out.append(m.name)
        short -= m.weight_bytes
        if short <= 0:
            return out
    raise PlacementError(
        f"{need_bytes / 2**30:.1f} GiB more do not fit even with every idle model evicted"
    )
