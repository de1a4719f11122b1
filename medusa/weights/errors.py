from __future__ import annotations

from medusa.errors import FallbackError


class WeightStoreError(FallbackError, ValueError):
    """A weight store that cannot be used (missing, damaged, or of another model); the message
    names the file (and the chunk) and what to do. The engine then loads the model file."""
