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
from typing import IO

from medusa import env as medusa_env
from medusa.child import medusa_cli, tied_to_this_process
from medusa.serve.protocol import WORKER_TOKEN_HEADER

log = logging.getLogger("medusa.gateway")


class WorkerAddress:
    """Where a worker listens and what every request to it carries (a mixin for the records of
    started and pooled workers, which have `port` and `token`)."""

    port: int
    token: str
    host: str = "127.0.0.1"  # where it listens (a Ray node's address for the ray back-end)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @cached_property
    def headers(self) -> dict[str, str]:
        """Without the token the worker answers 401."""
        return {"content-type": "application/json", WORKER_TOKEN_HEADER: self.token}


class WorkerProcess:
    """A worker started with `argv`; its stderr is drained into the last `keep` lines (the local
    back-end's WorkerHandle: placed as soon as started)."""

    host, port, token, node = "127.0.0.1", 0, "", "local"

    def __init__(self, argv: list[str], env: dict[str, str], *, keep: int = 20) -> None:
        # NOTE: the parent-death signal fires when the *thread* that forked exits: start workers
        # from the event loop's thread, never from a worker thread.
        self.popen = subprocess.Popen(
            argv,
            env=tied_to_this_process(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    slice_env: dict[str, str], args: list[str], host: str = "127.0.0.1"
) -> tuple[WorkerProcess, int, str]:
    """`medusa run ARGS` bound to a slice (its env), on a free port of `host`, with its own
    token: (process, port, token)."""
    port, token = free_port(), secrets.token_urlsafe(32)
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
    argv = medusa_cli("run", *args, "--host", host, "--port", str(port))
    proc = WorkerProcess(argv, env)
    proc.host, proc.port, proc.token = host, port, token
    return proc, port, token
