"""Where a server listens, made so that no other local user can get there first: a Unix socket
created exclusively (mode 0600, never over an existing file or link; the gateway's workers' are
in its private directory, medusa.serve.gateway.private_dir), a TCP socket bound to a port the
kernel picks (never a number chosen earlier, which another user could bind in between), or a
listening socket inherited from the process that made it (`medusa run --fd`)."""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from medusa.errors import RefusedError

BACKLOG = 1024
# NOTE: sun_path holds 108 bytes; a longer path cannot be bound.
MAX_UDS_PATH = 100


class ListenError(RefusedError, ValueError):
    """A socket that cannot be made where asked; the message says what to change."""


def bind_unix(path: str | Path) -> socket.socket:
    """A listening Unix socket at `path`, created by this call (never an existing file or link:
    bind refuses those) and readable by this user only."""
    path = str(path)
    if len(path.encode()) > MAX_UDS_PATH:
        raise ListenError(f"--uds {path}: longer than {MAX_UDS_PATH} bytes; use a shorter path")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # NOTE: the socket file takes its mode from the umask at bind(): 0600 from the first instant
    # (a chmod afterwards would leave a window, and follows links).
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ListenError(
                f"--uds {path}: something exists there already; remove it or pick a new path"
            ) from None
        raise ListenError(f"--uds {path}: cannot create the socket: {e.strerror}") from None
    finally:
        os.umask(old)
    sock.listen(BACKLOG)
    return sock


def bind_tcp(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on `host`; port 0: the kernel picks a free one, atomically."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ListenError(f"port {port} is in use; pass --port") from None
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(BACKLOG)
    return sock


def inherited(fd: int) -> socket.socket:
    """The listening stream socket this process was given as descriptor `fd`."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        raise ListenError(f"--fd {fd}: not an open socket ({e.strerror})") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_ACCEPTCONN
    ):
        sock.detach()
        raise ListenError(f"--fd {fd}: not a listening stream socket")
    # NOTE: no child of ours (a Tessera follower, vLLM) inherits it: only this process accepts.
    os.set_inheritable(fd, False)
    return sock


def describe(sock: socket.socket) -> str:
    """Where `sock` listens, as a user reads it."""
    where = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unix:{where}"
    return f"http://{where[0]}:{where[1]}"


@dataclass(frozen=True)
class Where:
    """Where `medusa run` listens: a Unix socket it makes at `uds`, the listening socket it
    inherited as `fd`, else `host`:`port`."""

    host: str = "127.0.0.1"
    port: int = 8000
    uds: str | None = None
    fd: int | None = None

    def check(self) -> None:
        """ListenError now for what would fail only after a slow start (a port in use, a path
        that exists, a descriptor that is no listening socket)."""
        if self.uds and self.fd is not None:
            raise ListenError("--uds and --fd: give one place to listen")
        if self.uds:
            where = Path(self.uds)
            if where.exists() or where.is_symlink():
                raise ListenError(f"--uds {self.uds}: something exists there; remove it first")
            if not where.parent.is_dir():
                raise ListenError(f"--uds {self.uds}: no such directory {where.parent}")
        elif self.fd is not None:
            inherited(self.fd).detach()
            os.set_inheritable(self.fd, True)  # NOTE: kept across the restore's re-exec
        else:
            bind_tcp(self.host, self.port).close()

    def open(self) -> Listener:
        if self.uds:
            sock = bind_unix(self.uds)
            return Listener(sock, self.uds, os.lstat(self.uds).st_ino)
        sock = inherited(self.fd) if self.fd is not None else bind_tcp(self.host, self.port)
        return Listener(sock)


@dataclass
class Listener:
    """An open listening socket; a Unix socket made at `path` (inode `made`) goes with it."""

    socket: socket.socket
    path: str = ""
    made: int = 0

    def close(self) -> None:
        self.socket.close()
        try:
            if self.path and os.lstat(self.path).st_ino == self.made:  # still the one we made
                os.unlink(self.path)
        except OSError:
            pass  # gone already
