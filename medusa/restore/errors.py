from __future__ import annotations

from medusa.errors import FallbackError


class RestoreError(FallbackError, RuntimeError):
    """The artifact cannot be used in this process; the message says exactly why."""
