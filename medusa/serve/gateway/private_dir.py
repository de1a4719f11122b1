"""A directory only this user can enter, made fresh for one process that shares files with the
workers it starts (the gateway, or a Ray node's slice actor): each elastic slice's page ledger,
and under `weaving/` the Weaver exchange regions its workers make and open (MEDUSA_WEAVING_DIR).

It is made with mkdtemp (a random name, mode 0700) in /dev/shm, or the temporary directory where
/dev/shm is not writable: no other user can plant a file or a link in it, or open what is in it.
Its owner holds an flock on its `lock` file for its life; a directory whose lock nobody holds
(its process died) is swept by the next one made."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "medusa-shm-"
LOCK = "lock"
WEAVING = "weaving"


def shm_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class PrivateDir:
    def __init__(self, where: Path | None = None) -> None:
        where = where or shm_dir()
        sweep(where)
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=where))
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._lock: int | None = os.open(self.path / LOCK, flags, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.mkdir(self.weaving, 0o700)

    @property
    def weaving(self) -> Path:
        """Where its workers make and open their exchange regions (by name)."""
        return self.path / WEAVING

    def remove(self) -> None:
        if self._lock is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)
        self._lock = None


def sweep(where: Path) -> None:
    """Removes this user's directories of processes now gone (SIGKILLed, a lost node's actor)."""
    for path in where.glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError):
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue  # another user's, or not one of ours
            fd = os.open(path / LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: alive
                shutil.rmtree(path, ignore_errors=True)
            finally:
                os.close(fd)
