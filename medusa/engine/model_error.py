"""Errors a user can act on when a model does not load."""

from __future__ import annotations

from medusa.errors import RefusedError


class ModelError(RefusedError, ValueError):
    """A model that cannot be loaded; the message names the file and what to change."""
