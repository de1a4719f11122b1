"""How far a store load has got, shared with C (mr_progress in csrc/restore/restore.h): the
engine's layer gate waits on it while the load runs in another thread."""

from __future__ import annotations

import ctypes
import functools
from ctypes import byref, c_int, c_void_p
from typing import Any

from medusa.cuda.native import restore_library
from medusa.weights.format import Header


class LoadProgress:
    """How far a store load has got (mr_progress in csrc/restore/restore.h): wait(offset) blocks,
    without the GIL, until every chunk holding a byte of the data below `offset` passed its
    checksum and its copies are queued on the load's stream. hold: chunks from this index on wait
    for release() (tests hold a load part way)."""

    def __init__(self, h: Header, hold: int | None = None) -> None:
        self.lib = _progress_lib()
        self.handle = self.lib.mr_progress_new(h.chunk_size, h.num_chunks,
                                               0xFFFFFFFF if hold is None else hold)  # fmt: skip
        if not self.handle:
            raise MemoryError("mr_progress_new: out of memory")

    def wait(self, offset: int) -> tuple[int, int]:
        """(0, 0): in; (1, chunk): that chunk did not match its checksum; (2, 0): the load stopped
        otherwise (its own error says why)."""
        bad = ctypes.c_uint32()
        code = self.lib.mr_progress_wait(self.handle, offset, byref(bad))
        return code, bad.value

    @property
    def num_done(self) -> int:
        return int(self.lib.mr_progress_done(self.handle))

    def release(self, hold: int | None = None) -> None:
        self.lib.mr_progress_release(self.handle, 0xFFFFFFFF if hold is None else hold)

    def stop(self) -> None:
        self.lib.mr_progress_stop(self.handle)

    def close(self) -> None:
        """Only once the load has returned."""
        if self.handle:
            self.lib.mr_progress_free(self.handle)
            self.handle = None


@functools.cache
def _progress_lib() -> Any:
    lib = restore_library()
    lib.mr_progress_new.restype = c_void_p
    lib.mr_progress_new.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32]
    lib.mr_progress_wait.restype = c_int
    lib.mr_progress_wait.argtypes = [c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint32)]
    lib.mr_progress_done.restype = ctypes.c_uint32
    lib.mr_progress_done.argtypes = [c_void_p]
    for name in ("mr_progress_free", "mr_progress_stop"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [c_void_p]
    lib.mr_progress_release.restype = None
    lib.mr_progress_release.argtypes = [c_void_p, ctypes.c_uint32]
    return lib
