from __future__ import annotations


class RestoreError(RuntimeError):
    """The artifact cannot be used in this process; the message says exactly why."""
