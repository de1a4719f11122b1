"""The one error an unusable artifact raises."""

from __future__ import annotations


class ArtifactError(ValueError):
    """An artifact that must not be used; the message names the file and what to do."""
