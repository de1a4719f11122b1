"""Online restore of an artifact (the C graph builder is csrc/restore/)."""

from medusa.restore.restorer import RestoreError, Restorer, RestoreResult

__all__ = ["RestoreError", "RestoreResult", "Restorer"]
