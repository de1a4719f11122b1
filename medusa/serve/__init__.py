"""Serving: the worker's OpenAI-compatible API and the gateway."""

# Request bodies larger than this get 413 (worker and gateway; --max-request-bytes changes it).
MAX_BODY_BYTES = 4 << 20
