"""The alpha controller (C2CServe Algorithm 2): per interval, the EMA-smoothed imbalance
Delta = U_C2C - U_HBM moves alpha toward the under-used resource, fast when latency misses its
target and slowly otherwise, not at all inside the dead band tau, clipped to [0, 1]. The new value
is taken up only at a layer or request boundary (the caller applies `alpha`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlphaController:
    alpha: float = 0.0  # all weight-stationary: W crosses C2C once
    tau: float = 0.05
    smoothing: float = 0.5  # EMA weight of the past
    fast_step: float = 0.2
    slow_step: float = 0.05
    delta: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha={self.alpha}: must be in [0, 1]")
        if self.tau < 0 or not 0.0 <= self.smoothing < 1.0:
            raise ValueError("tau must be >= 0 and smoothing in [0, 1)")

    def update(self, u_c2c: float, u_hbm: float, latency: float, target: float) -> float:
        d = u_c2c - u_hbm
        self.delta = (
            d if self.delta is None else self.smoothing * self.delta + (1 - self.smoothing) * d
        )
        if abs(self.delta) <= self.tau:
            return self.alpha
        step = self.fast_step if latency > target else self.slow_step
        # C2C-bound: fewer output-stationary columns (W read fewer times); HBM-bound: more.
        self.alpha += -step if self.delta > 0 else step
        self.alpha = min(1.0, max(0.0, self.alpha))
        return self.alpha
