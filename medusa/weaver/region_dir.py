"""Where a gateway's workers make and open exchange regions: the private directory the gateway
gave them at start (MEDUSA_WEAVING_DIR). A region is asked for by name, never by path: the name
is a plain file name (no `/`, no leading dot), resolved in the directory opened once (O_NOFOLLOW),
and the directory must be this user's and closed to everyone else (mode 0700), so a caller can
neither reach a file elsewhere nor one another user planted."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from medusa.weaver.region import ExchangeRegion, Geometry, RegionError

NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"  # what a region may be called


class RegionDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.fd = os.open(self.path, flags)
        except OSError as e:
            raise RegionError(f"weaving directory {self.path}: {e.strerror}") from None
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            os.close(self.fd)
            raise RegionError(
                f"weaving directory {self.path}: not a private directory of this user (owner "
                f"uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); the gateway makes it (700)"
            )

    def where(self, name: str) -> Path:
        if not re.fullmatch(NAME, name):
            raise RegionError(f"region {name!r}: expected a name ({NAME}), not a path")
        return self.path / name

    def create(self, name: str, geometry: Geometry) -> ExchangeRegion:
        return ExchangeRegion.create(self.where(name), geometry, dir_fd=self.fd)

    def open(self, name: str) -> ExchangeRegion:
        return ExchangeRegion(self.where(name), dir_fd=self.fd)

    def close(self) -> None:
        os.close(self.fd)
