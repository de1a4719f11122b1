"""The one error an unusable artifact raises."""

from __future__ import annotations

from medusa.errors import RefusedError


class ArtifactError(RefusedError, ValueError):
    """An artifact that must not be used; the message names the file and what to do."""
