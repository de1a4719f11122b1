"""Medusa's own C library beside the CUDA API: libmedusa_restore (csrc/restore/), which holds the
restore's graph builder (medusa.restore) and the weight store's chunk loader (medusa.weights)."""

from __future__ import annotations

import ctypes
import functools

from medusa.cuda import paths
from medusa.cuda.errors import LibraryVersionError

ABI_VERSION = 8  # MR_ABI_VERSION in csrc/restore/restore.h


@functools.cache
def restore_library() -> ctypes.CDLL:
    """libmedusa_restore, refused unless built from this version's sources (its layouts)."""
    path = paths.library("medusa_restore")
    lib = ctypes.CDLL(str(path))
    if getattr(lib, "mr_abi_version", lambda: 1)() != ABI_VERSION:
        raise LibraryVersionError(
            f"{path} was built for another version of medusa (its layouts differ); "
            "reinstall the package (`pip install .`) or point MEDUSA_LIB_DIR at a fresh build"
        )
    return lib
