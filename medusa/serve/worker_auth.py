"""How the gateway and its workers prove themselves to each other.

The gateway never sends a worker its token: each request carries a fresh nonce and
HMAC(token, "request:" nonce) (WORKER_AUTH_HEADER), and the worker's answer carries
HMAC(token, "answer:" nonce) (WORKER_PROOF_HEADER), which the gateway checks before it relays a
byte of it. Whatever answers in a worker's place (a port taken by someone else) learns nothing
it can use, and its answers are refused."""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from medusa.serve.protocol import APIError

WORKER_TOKEN_HEADER = "x-medusa-worker-token"  # the token itself (an operator's own request)
WORKER_AUTH_HEADER = "x-medusa-worker-auth"  # "NONCE.HMAC": the gateway's requests
WORKER_PROOF_HEADER = "x-medusa-worker-proof"  # the worker's answer to NONCE
MAX_NONCE = 64  # bytes


def worker_mac(token: bytes, purpose: bytes, nonce: bytes) -> bytes:
    """HMAC-SHA256 of `purpose:nonce` under a worker's token, hex: "request" (the gateway
    proves it holds the token) or "answer" (the worker does)."""
    return hmac.new(token, purpose + b":" + nonce, hashlib.sha256).hexdigest().encode()


class TokenGuard:
    """ASGI middleware: with a token set, only callers that prove they hold it (the gateway) get
    in; every answer to a request that sent a nonce proves this worker holds it too."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        nonce, _, mac = headers.get(WORKER_AUTH_HEADER.encode(), b"").partition(b".")
        nonce = nonce[:MAX_NONCE]
        if nonce:
            send = _proving(send, worker_mac(self.token, b"answer", nonce))
        sent = headers.get(WORKER_TOKEN_HEADER.encode(), b"")
        if not (
            nonce and hmac.compare_digest(mac, worker_mac(self.token, b"request", nonce))
        ) and not hmac.compare_digest(sent, self.token):
            refused = APIError(
                401,
                "this worker answers only its gateway; send requests to the gateway",
                kind="auth_error",
                code="invalid_worker_token",
            )
            await refused.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _proving(send: Send, proof: bytes) -> Send:
    """`send` with the worker's proof added to the answer's headers."""

    async def send_with_proof(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (
                WORKER_PROOF_HEADER.encode(), proof)]}  # fmt: skip
        await send(message)

    return send_with_proof
