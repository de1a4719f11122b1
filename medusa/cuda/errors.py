from __future__ import annotations

from medusa.errors import MedusaError


class CudaError(MedusaError, RuntimeError):
    """A CUDA call failed; carries the call, the numeric code and the CUDA error name."""

    def __init__(self, call: str, code: int, name: str, message: str = "") -> None:
        detail = f": {message}" if message else ""
        super().__init__(f"{call} failed with {name} ({code}){detail}")
        self.call = call
        self.code = code
        self.name = name
