"""How the gateway talks to one of its workers: over the worker's Unix socket (the local
back-end's, in a directory only the gateway's user can enter) or TCP (a Ray node's), never
sending the worker's token: each request proves the gateway holds it, and the answer must prove
the worker does (medusa.serve.protocol), or it is refused before a byte of it is relayed."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Generator

import httpx

from medusa.errors import EngineDeadError
from medusa.serve.protocol import WORKER_AUTH_HEADER, WORKER_PROOF_HEADER, worker_mac

# The gateway's requests wait up to this for an answer (a long generation); connecting is quick.
TIMEOUT = httpx.Timeout(600.0, connect=5.0)


class NotOurWorker(EngineDeadError, httpx.TransportError):
    """Something answered in the worker's place without proving it is the worker the gateway
    started (it does not hold the worker's token): a port taken by someone else."""


class WorkerAuth(httpx.Auth):
    """Signs each request with a fresh nonce; checks the answer's proof (a TransportError
    otherwise, so callers treat it as a worker that is gone)."""

    def __init__(self, token: str) -> None:
        self.token = token.encode()

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        nonce = secrets.token_hex(16).encode()
        mac = worker_mac(self.token, b"request", nonce)
        request.headers[WORKER_AUTH_HEADER] = (nonce + b"." + mac).decode()
        response = yield request
        proof = response.headers.get(WORKER_PROOF_HEADER, "").encode()
        if not hmac.compare_digest(proof, worker_mac(self.token, b"answer", nonce)):
            where = request.url.netloc.decode()
            raise NotOurWorker(
                f"{where} answered without proving it is the gateway's worker (a port taken by "
                "another program?): its answer was dropped",
                request=request,
            )


def connect(
    uds: str, host: str, port: int, token: str, timeout: float | httpx.Timeout = TIMEOUT
) -> httpx.AsyncClient:
    """A client of the worker at `uds` (a Unix socket), else `host:port`; its requests go to
    paths (base_url is the worker)."""
    # NOTE: plain HTTP: no TLS context to build (certifi's costs ~80 ms a client); no proxy.
    transport = httpx.AsyncHTTPTransport(uds=uds or None, verify=False)
    base = "http://worker" if uds else f"http://{host}:{port}"
    return httpx.AsyncClient(
        base_url=base,
        transport=transport,
        auth=WorkerAuth(token),
        trust_env=False,
        timeout=timeout,
    )
