from __future__ import annotations

from medusa.errors import MedusaError, RefusedError


class CudaError(MedusaError, RuntimeError):
    """A CUDA call failed; carries the call, the numeric code and the CUDA error name."""

    def __init__(self, call: str, code: int, name: str, message: str = "") -> None:
        detail = f": {message}" if message else ""
        super().__init__(f"{call} failed with {name} ({code}){detail}")
        self.call = call
        self.code = code
        self.name = name


class LibraryVersionError(RefusedError, RuntimeError):
    """One of Medusa's C libraries was built from other sources than this package (its layouts
    differ from the ones the Python side packs)."""
