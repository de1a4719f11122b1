"""Errors a user can act on when a model does not load."""

from __future__ import annotations


class ModelError(ValueError):
    """A model that cannot be loaded; the message names the file and what to change."""
