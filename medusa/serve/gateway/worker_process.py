"""One `medusa run` child of the gateway: it dies with the gateway, and the last lines it wrote to
stderr are kept (bounded) to say why it failed."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import secrets
import socket
import subprocess
import threading
import time
from functools import cached_property
from pathlib import Path
from typing import IO, TYPE_CHECKING

import httpx

from medusa import env as medusa_env
from medusa.child import medusa_cli, tied_to_this_process
from medusa.serve.gateway.hop import Hop
from medusa.serve.gateway.worker_link import connect

if TYPE_CHECKING:
    from medusa.serve.gateway.backends import WorkerHandle

log = logging.getLogger("medusa.gateway")


class WorkerAddress:
    """Where a worker listens and how the gateway talks to it (a mixin for the records of
    started and pooled workers: their `proc` says, once placed)."""

    proc: WorkerHandle

    @property
    def host(self) -> str:
        return self.proc.host

    @property
    def port(self) -> int:
        return self.proc.port

    @property
    def name(self) -> str:
        """Unique on its machine, fit for a file name: its socket's, else host-port."""
        if self.proc.uds:
            return Path(self.proc.uds).parent.name + "-" + Path(self.proc.uds).stem
        return f"{self.proc.host}-{self.proc.port}"

    @property
    def client(self) -> httpx.AsyncClient:
        """The worker's client: requests go to paths, proven both ways (worker_link)."""
        return self.proc.client

    def connect(self, timeout: float) -> httpx.AsyncClient:
        """A client of its own (the caller closes it)."""
        return connect(self.proc.uds, self.host, self.port, self.proc.token, timeout=timeout)


class WorkerProcess:
    """A worker started with `argv`, serving on `listener` (which it is handed: nobody else can
    accept on it); its stderr is drained into the last `keep` lines (the local back-end's
    WorkerHandle: placed as soon as started)."""

    host, port, uds, node = "127.0.0.1", 0, "", "local"

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        listener: socket.socket,
        token: str,
        *,
        keep: int = 20,
    ) -> None:
        self.token = token
        if listener.family == socket.AF_UNIX:
            self.uds = listener.getsockname()
        else:
            self.host, self.port = listener.getsockname()[:2]
        fd = listener.fileno()
        # NOTE: the parent-death signal fires when the *thread* that forked exits: start workers
        # from the event loop's thread, never from a worker thread.
        try:
            self.popen = subprocess.Popen(
                [*argv, "--fd", str(fd)],
                env=tied_to_this_process(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(fd,),
            )
        finally:
            listener.close()  # NOTE: the worker's alone: its death closes it
        self.stderr: collections.deque[str] = collections.deque(maxlen=keep)
        assert self.popen.stderr is not None
        self._reader = threading.Thread(
            target=self._drain, args=(self.popen.stderr,), name="medusa-worker-stderr", daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    async def placed(self, timeout: float) -> bool:
        return self.poll() is None

    @cached_property
    def client(self) -> httpx.AsyncClient:
        return connect(self.uds, self.host, self.port, self.token)

    @cached_property
    def hop(self) -> Hop:
        return Hop(self.uds, self.host, self.port, self.token)

    def _drain(self, pipe: IO[bytes]) -> None:
        with pipe:
            for line in pipe:
                text = line.decode("utf-8", "replace").rstrip()
                if text:
                    self.stderr.append(text[:500])

    def last_error(self) -> str:
        """The worker's last stderr line, or how it ended."""
        if self.stderr:
            return self.stderr[-1]
        code = self.popen.poll()
        return "it is still running" if code is None else f"it exited with status {code}"

    async def exited(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for the process to end (and its stderr to be read)."""
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.popen.poll() is None:
            return False
        await asyncio.to_thread(self._reader.join, 1.0)  # the lines written before the exit
        return True

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()

    async def reap(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; returns once the process is gone."""
        self.terminate()
        if not await self.exited(timeout):
            log.warning("worker pid %d ignored SIGTERM for %.0f s: killing it", self.pid, timeout)
            self.popen.kill()
            await asyncio.to_thread(self.popen.wait)
        if "client" in self.__dict__:
            await self.client.aclose()
        if "hop" in self.__dict__:
            self.hop.close()
        if self.uds:
            Path(self.uds).unlink(missing_ok=True)


def launch(slice_env: dict[str, str], args: list[str], listener: socket.socket) -> WorkerProcess:
    """`medusa run ARGS` bound to a slice (its env), serving on `listener` (a socket the caller
    bound: a Unix socket in a private directory, or a TCP port the kernel picked), with a token
    of its own."""
    token = secrets.token_urlsafe(32)
    # NOTE: a slice's device is its env's alone; how simcuda checks and schedules work is not
    # the device's, and stays as the gateway was told (the test suite's race checking).
    checks = (medusa_env.SIM_RACECHECK.name, medusa_env.SIM_SCHEDULE_SEED.name)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEDUSA_SIM_", "MEDUSA_TRACE", "MEDUSA_MODE")) or k in checks
    }
    env.update(slice_env)
    env[medusa_env.WORKER_TOKEN.name] = token
    return WorkerProcess(medusa_cli("run", *args), env, listener, token)
