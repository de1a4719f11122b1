"""The partition planner: a MILP (HiGHS, through scipy.optimize.milp) placing each kernel on a
device. A cut edge u -> v costs c = latency + bytes / bandwidth on v's device. Objectives:
throughput minimizes max over devices of max(compute time, incoming transfer time) (the period of
a pipelined steady state); latency minimizes the sum of kernel times and cut-edge costs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix


@dataclass(frozen=True)
class Device:
    name: str
    memory: float  # bytes the kernels' resident data may take


@dataclass(frozen=True)
class Link:
    latency: float  # seconds
    bandwidth: float  # bytes per second

    def cost(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Problem:
    devices: list[Device]
    times: np.ndarray  # [kernels, devices] seconds
    edges: list[tuple[int, int, float]]  # (producer, consumer, bytes)
    link: Link
    memory: np.ndarray | None = None  # [kernels] resident bytes (weights, its KV share)
    pinned: list[set[int]] = field(default_factory=list)  # each group on one device
    fixed: dict[int, int] = field(default_factory=dict)  # kernel -> device

    def __post_init__(self) -> None:
        if self.times.ndim != 2 or self.times.shape[1] != len(self.devices):
            raise ValueError(f"times must be [kernels, {len(self.devices)} devices]")


@dataclass(frozen=True)
class Plan:
    placement: list[int]  # kernel -> device
    objective: float
    compute: list[float]  # per device
    transfer: list[float]  # per device, incoming
    solve_seconds: float
    status: str

    @property
    def period(self) -> float:
        return max(max(c, m) for c, m in zip(self.compute, self.transfer, strict=True))


def evaluate(p: Problem, placement: list[int]) -> tuple[list[float], list[float]]:
    """(compute, incoming transfer) seconds per device for a placement."""
    nd = len(p.devices)
    comp = [float(sum(p.times[k, d] for k, x in enumerate(placement) if x == d)) for d in range(nd)]
    inc = [0.0] * nd
    for u, v, b in p.edges:
        if placement[u] != placement[v]:
            inc[placement[v]] += p.link.cost(b)
    return comp, inc


class _Builder:
    def __init__(self, nvars: int) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.nvars = nvars

    def add(self, terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.lo)
        for c, v in terms:
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        self.lo.append(lo)
        self.hi.append(hi)

    def constraint(self) -> LinearConstraint:
        a = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lo), self.nvars))
        return LinearConstraint(a.tocsr(), np.array(self.lo), np.array(self.hi))


def solve(
    p: Problem, objective: str = "throughput", time_limit: float = 10.0, gap: float = 1e-3
) -> Plan:
    if objective not in ("throughput", "latency"):
        raise ValueError(f"objective {objective!r}: use 'throughput' or 'latency'")
    nk, nd, ne = p.times.shape[0], len(p.devices), len(p.edges)
    x = lambda k, d: k * nd + d  # noqa: E731
    y = lambda e: nk * nd + e  # noqa: E731
    w = lambda e, d: nk * nd + ne + e * nd + d  # noqa: E731
    z = nk * nd + ne + ne * nd
    nvars = z + 1
    cost = [p.link.cost(b) for _, _, b in p.edges]
    b = _Builder(nvars)
    for k in range(nk):
        b.add([(x(k, d), 1.0) for d in range(nd)], 1, 1)
    for e, (u, v, _) in enumerate(p.edges):
        for d in range(nd):
            b.add([(y(e), 1.0), (x(u, d), -1.0), (x(v, d), 1.0)], 0, np.inf)
            b.add([(w(e, d), 1.0), (x(v, d), -1.0), (y(e), -1.0)], -1, np.inf)
    if p.memory is not None:
        for d, dev in enumerate(p.devices):
            b.add([(x(k, d), float(p.memory[k])) for k in range(nk)], 0, dev.memory)
    for group in p.pinned:
        first, *rest = sorted(group)
        for k in rest:
            for d in range(nd):
                b.add([(x(k, d), 1.0), (x(first, d), -1.0)], 0, 0)
    c = np.zeros(nvars)
    if objective == "throughput":
        for d in range(nd):
            b.add([(z, 1.0)] + [(x(k, d), -float(p.times[k, d])) for k in range(nk)], 0, np.inf)
            b.add([(z, 1.0)] + [(w(e, d), -cost[e]) for e in range(ne)], 0, np.inf)
        c[z] = 1.0
    else:
        for k in range(nk):
            for d in range(nd):
                c[x(k, d)] = p.times[k, d]
        for e in range(ne):
            c[y(e)] = cost[e]
    lo, hi = np.zeros(nvars), np.ones(nvars)
    hi[z] = np.inf
    for k, d in p.fixed.items():
        lo[x(k, d)] = 1.0
    integrality = np.zeros(nvars)
    integrality[: nk * nd] = 1
    t0 = time.perf_counter()
    res = milp(
        c,
        constraints=b.constraint(),
        integrality=integrality,
        bounds=Bounds(lo, hi),
        options={"time_limit": time_limit, "mip_rel_gap": gap},
    )
    dt = time.perf_counter() - t0
    if res.x is None:
        raise ValueError(f"no placement fits: {res.message} (check device memory and pins)")
    xs = res.x[: nk * nd].reshape(nk, nd)
    placement = [int(i) for i in xs.argmax(axis=1)]
    comp, inc = evaluate(p, placement)
    return Plan(placement, float(res.fun), comp, inc, dt, res.message)
