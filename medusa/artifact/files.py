"""Reading an artifact's files without ever leaving its directory.

Names are checked against a fixed pattern before use, every component is opened relative to the
artifact directory with O_NOFOLLOW (a symbolic link is refused, not followed), and only regular
files of the size the manifest states are read."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from medusa.artifact.errors import ArtifactError
from medusa.artifact.schema import FILE_NAME

MANIFEST = "manifest.json"
SEAL = "seal.json"
_TOP = re.compile(rf"{re.escape(MANIFEST)}|{re.escape(SEAL)}|{FILE_NAME.pattern}")
_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO never hangs


class ArtifactDir:
    """An artifact directory; `read` and `sha256` of the files it may hold."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self, name: str, size: int | None = None, *, max_size: int = 0) -> bytes:
        """The file's bytes: exactly `size` of them, or (size None) at most `max_size`."""
        with self._open(name, size, max_size) as (fd, n):
            chunks, left = [], n
            while left:
                chunk = os.read(fd, min(left, 1 << 24))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        data = b"".join(chunks)
        if len(data) != n:
            raise ArtifactError(f"{self.path / name}: changed while being read; materialize again")
        return data

    def sha256(self, name: str, size: int) -> str:
        h = hashlib.sha256()
        with self._open(name, size, 0) as (fd, n):
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
                n -= len(chunk)
        if n:
            raise ArtifactError(f"{self.path / name}: changed while being read; materialize again")
        return h.hexdigest()

    def exists(self, name: str) -> bool:
        try:
            with self._open(name, None, 1 << 62):
                return True
        except ArtifactError:
            return False

    @contextmanager
    def _open(self, name: str, size: int | None, max_size: int) -> Iterator[tuple[int, int]]:
        if not _TOP.fullmatch(name):
            raise ArtifactError(
                f"{self.path}: the file name {name[:80]!r} is not one an artifact holds "
                f"({MANIFEST}, {SEAL}, plan.msgpack.zst, images/<sha256>.img)"
            )
        fds: list[int] = []
        try:
            fds.append(self._os_open(str(self.path), os.O_RDONLY | os.O_DIRECTORY, name, None))
            *dirs, leaf = name.split("/")
            for d in dirs:
                fds.append(self._os_open(d, _FLAGS | os.O_DIRECTORY, name, fds[-1]))
            fd = self._os_open(leaf, _FLAGS, name, fds[-1])
            fds.append(fd)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ArtifactError(f"{self.path / name}: not a regular file; materialize again")
            if size is not None and st.st_size != size:
                raise ArtifactError(
                    f"{self.path / name}: {st.st_size} bytes, the manifest says {size} (truncated "
                    "or replaced; materialize again)"
                )
            if size is None and st.st_size > max_size:
                raise ArtifactError(
                    f"{self.path / name}: {st.st_size} bytes, more than the {max_size} such a "
                    "file may have; materialize again"
                )
            yield fd, st.st_size
        finally:
            for fd in reversed(fds):
                os.close(fd)

    def _os_open(self, part: str, flags: int, name: str, dir_fd: int | None) -> int:
        try:
            return os.open(part, flags, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and dir_fd is not None):
                raise ArtifactError(
                    f"{self.path / name}: a symbolic link or not a plain file; an artifact holds "
                    "only regular files in its own directory (materialize again)"
                ) from None
            if e.errno == errno.ENOENT and (dir_fd is None or name == MANIFEST):
                raise ArtifactError(
                    f"{self.path}: no {MANIFEST}; not an artifact (make one with medusa "
                    "materialize)"
                ) from None
            if e.errno == errno.ENOENT:
                raise ArtifactError(
                    f"{self.path / name}: missing (the artifact is incomplete; materialize again)"
                ) from None
            raise ArtifactError(f"{self.path / name}: cannot be opened ({e.strerror})") from None
