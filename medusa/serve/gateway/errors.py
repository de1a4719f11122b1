"""Why the gateway cannot take a request now: each carries the Retry-After it answers with."""

from __future__ import annotations

from medusa.errors import BusyError
from medusa.serve.gateway.start_policy import Failure


class Unavailable(BusyError):
    """No instance can take the request now; `retry_after` seconds is when to ask again."""

    def __init__(self, message: str, retry_after: int, code: str) -> None:
        super().__init__(message)
        self.retry_after, self.code = retry_after, code


class NoCapacity(Unavailable):
    def __init__(self, message: str) -> None:
        super().__init__(message, 5, "no_capacity")


class StartFailed(Unavailable):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message, failure.retry_after, "model_start_failed")


class ShuttingDown(Unavailable):
    def __init__(self) -> None:
        super().__init__("the gateway is shutting down; retry on another", 5, "shutting_down")


class QueueFull(BusyError):
    """The model's queue is full (the gateway answers 429 with Retry-After)."""
