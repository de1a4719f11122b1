"""Online restore of an artifact (the C graph builder is csrc/restore/)."""

from medusa.restore.errors import RestoreError
from medusa.restore.restorer import Restorer, RestoreResult

__all__ = ["RestoreError", "RestoreResult", "Restorer"]
