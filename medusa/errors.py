"""Errors more than one package raises for the same reason, defined once."""

from __future__ import annotations


class PlacementError(ValueError):
    """A set of models the devices cannot serve: one fits on none of them (its weights and its
    minimum KV cache, or the HBM it needs), or together they ask more of a shared link than it
    carries. The message names the model or the demand, and what to change."""
