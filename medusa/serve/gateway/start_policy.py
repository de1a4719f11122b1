"""When the gateway may start a model's worker again after starts failed: a few tries with
backoff, then the model is failed (requests refused with the reason) until a cool-down passes."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from medusa.serve.gateway.config import ModelConfig


@dataclass(frozen=True)
class Failure:
    model: str
    attempts: int
    reason: str
    until: float  # time.monotonic() when a request may try again

    @property
    def retry_after(self) -> int:
        return max(1, math.ceil(self.until - time.monotonic()))

    @property
    def message(self) -> str:
        return (
            f"model {self.model!r}: its worker failed to start {self.attempts} times; the last "
            f"error: {self.reason}. Fix the model's settings and restart the gateway, or retry "
            f"in {self.retry_after} s"
        )


class StartPolicy:
    def __init__(self, models: dict[str, ModelConfig], *, backoff: float = 1.0) -> None:
        self.models = models
        self.backoff = backoff  # seconds before the 2nd try; doubled for each try after
        self._attempts = dict.fromkeys(models, 0)
        self._retry_at = dict.fromkeys(models, 0.0)
        self._failed: dict[str, Failure] = {}

    def failure(self, model: str) -> Failure | None:
        """Why `model` refuses requests, or None (also once its cool-down has passed)."""
        f = self._failed.get(model)
        if f is not None and time.monotonic() >= f.until:
            del self._failed[model]
            self._attempts[model] = 0
            return None
        return f

    def can_start(self, model: str) -> bool:
        return self.failure(model) is None and time.monotonic() >= self._retry_at[model]

    def backing_off(self, model: str) -> bool:
        return self.failure(model) is None and time.monotonic() < self._retry_at[model]

    def started(self, model: str) -> None:
        self._attempts[model] = 0

    def start_failed(self, model: str, reason: str) -> Failure | None:
        """Counts a failed start; returns the Failure once the model has used its attempts."""
        cfg = self.models[model]
        n = self._attempts[model] = self._attempts[model] + 1
        now = time.monotonic()
        if n >= cfg.start_attempts:
            self._failed[model] = Failure(model, n, reason, now + cfg.failure_cooldown)
            return self._failed[model]
        self._retry_at[model] = now + self.backoff * 2 ** (n - 1)
        return None
