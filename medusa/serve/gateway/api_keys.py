"""The gateway's optional bearer keys (the config's api_keys): without any, every caller gets in."""

from __future__ import annotations

import hmac

from fastapi import Request
from fastapi.responses import JSONResponse

from medusa.serve.protocol import APIError


class ApiKeys:
    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = [k.encode() for k in keys]

    def allow(self, request: Request) -> bool:
        if not self.keys:
            return True
        auth = request.headers.get("authorization", "")
        sent = auth[7:].encode() if auth.startswith("Bearer ") else b""
        # NOTE: constant-time, every key compared: how long a refusal takes says nothing.
        return sent != b"" and sum(hmac.compare_digest(sent, k) for k in self.keys) > 0

    @staticmethod
    def refusal() -> JSONResponse:
        return APIError(
            401,
            "a valid API key is required (Authorization: Bearer ...)",
            kind="auth_error",
            code="invalid_api_key",
        ).response()
