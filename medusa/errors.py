"""One tree of Medusa's errors, split by what the caller should do with one.

Every error Medusa raises on purpose derives from `MedusaError`, and its message says what to do.
Below the root, the branch tells a caller its next step without knowing the class (vLLM splits
`EngineGenerateError` from `EngineDeadError` the same way):

- `RefusedError`: the input (an artifact, a model, a trace, a config, a placement, a file) cannot
  be used as it is. Nothing was changed; fix the input and ask again.
- `FallbackError`: a fast path cannot be used here (a restore, the weight store, weaving); the
  caller takes the slow path that gives the same answer, and says why.
- `BusyError`: nothing is wrong, but there is no room now (a full queue, no free KV page); ask again
  later (`retry_after` seconds where the error knows it).
- `EngineDeadError`: the engine, worker or link the caller holds can no longer serve; replace it.

Two errors sit on the root itself because their meaning depends on where they happen: `CudaError`
(a failed CUDA call: a start-up falls back, a serving engine is dead) and `APIError` (an HTTP
answer, whose status tells the client). Each class keeps the built-in base it had (ValueError,
RuntimeError, ConnectionError...), so code that caught those still does.
"""

from __future__ import annotations


class MedusaError(Exception):
    """An error Medusa raises on purpose; the message names what went wrong and what to do."""


class RefusedError(MedusaError):
    """The input cannot be used as it is; nothing was changed. Fix it and ask again."""


class FallbackError(MedusaError):
    """A fast path cannot be used here; the caller takes the slow path and says why."""


class BusyError(MedusaError):
    """No room now (nothing is wrong); ask again later."""


class EngineDeadError(MedusaError):
    """The engine, worker or link can no longer serve; replace it."""
