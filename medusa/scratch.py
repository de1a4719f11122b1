"""Scratch directories in shared places (/tmp, an artifact's parent directory): made 0700 and
exclusively (mkdtemp), named after their process (PREFIX<pid>-XXXXXXXX), and locked (flock) by it
while it lives. The process removes its own when done or stopped by a signal (see
medusa.child.exit_on_sigterm); those of a killed process (SIGKILL, a crash) are removed by the
next process that makes one with the same prefix in the same place: only directories of this
user, not links, whose lock nobody holds and whose pid is no live process here."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from medusa import env

RESTORE_TRACE = "medusa-restore-"  # `medusa run --artifact`'s restore-mode trace, in /tmp


class ScratchDir:
    def __init__(self, prefix: str, root: str | Path | None = None, *, across_exec: bool = False):
        """across_exec: the lock survives this process's execve (the directory is made for the
        program it becomes)."""
        sweep(prefix, root)
        self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.set_inheritable(self._fd, across_exec)

    def close(self) -> None:
        """Removes the directory and what it holds."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.keep()

    def keep(self) -> None:
        """Unlocks the directory and leaves it (it was renamed into place: it is no scratch)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.close()


def sweep(prefix: str, root: str | Path | None = None) -> list[Path]:
    """Removes the PREFIX<pid>-* directories under `root` (default: the temporary directory)
    left by processes of this user that are gone; returns them."""
    where = Path(root or tempfile.gettempdir())
    name = re.compile(re.escape(prefix) + r"([0-9]{1,10})-[A-Za-z0-9_]{1,32}")
    try:
        entries = os.listdir(where)
    except OSError:
        return []
    gone = []
    for entry in entries:
        m = name.fullmatch(entry)
        if m is not None and not _alive(int(m.group(1))) and _remove_if_stale(where / entry):
            gone.append(where / entry)
    return gone


def owned_by_this_process(path: Path, prefix: str) -> bool:
    """Whether `path` is named as this process's PREFIX directory."""
    return path.name.startswith(f"{prefix}{os.getpid()}-")


def remove_restore_trace() -> None:
    """The restore-mode trace `medusa run` re-executed itself under (MEDUSA_TRACE, in a
    ScratchDir(RESTORE_TRACE)) is read during start-up only: its directory goes once the engine
    has started, or the process stops. (The recorder's open file lives on, unnamed.)"""
    trace = env.TRACE.get()
    if trace and owned_by_this_process(Path(trace).parent, RESTORE_TRACE):
        shutil.rmtree(Path(trace).parent, ignore_errors=True)


def _remove_if_stale(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False  # gone, a link, or not a directory
    try:
        if os.fstat(fd).st_uid != os.getuid() or not stat.S_ISDIR(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its process lives (elsewhere: another pid namespace)
        shutil.rmtree(path, ignore_errors=True)  # NOTE: fd-based: a link inside is not followed
        return True
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process's: leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or no pid at all: not ours to judge
    return True
