"""NCCL's C API, through ctypes, for the engine's tensor parallelism: on a GPU the real NCCL (the
nvidia-nccl-cu13 wheel's libnccl.so.2, or the system's), on simcuda libmedusa_nccl, which
implements the same subset over shared memory between the rank processes (one per rank, each
with its own device). Collectives run on a stream, so a stream capture records them."""

from __future__ import annotations

import ctypes
import importlib.util
import os
from ctypes import POINTER, byref, c_char, c_int, c_size_t, c_void_p
from pathlib import Path

from medusa.cuda import paths
from medusa.cuda.backend import Backend
from medusa.errors import MedusaError

DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
          "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}  # fmt: skip
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
RESULTS = [
    "ncclSuccess",
    "ncclUnhandledCudaError",
    "ncclSystemError",
    "ncclInternalError",
    "ncclInvalidArgument",
    "ncclInvalidUsage",
    "ncclRemoteError",
    "ncclInProgress",
]


class NcclError(MedusaError, RuntimeError):
    """An NCCL call failed; carries the call, NCCL's result code and its name."""

    def __init__(self, call: str, code: int, detail: str) -> None:
        name = RESULTS[code] if 0 <= code < len(RESULTS) else f"result {code}"
        super().__init__(f"{call} failed with {name} ({code}): {detail}")
        self.call, self.code, self.name = call, code, name


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", c_char * 128)]


def _real_nccl() -> Path | str:
    """libnccl.so.2 of the nvidia-nccl-cu13 wheel, else the system's (by soname)."""
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    for root in spec.submodule_search_locations or [] if spec else []:
        lib = Path(root) / "lib" / "libnccl.so.2"
        if lib.is_file():
            return lib
    return "libnccl.so.2"


class Nccl:
    """The library for a back-end: libmedusa_nccl on simcuda (which it needs loaded first), the
    real NCCL on a GPU."""

    def __init__(self, backend: Backend) -> None:
        kind = backend.kind
        path = paths.library("medusa_nccl") if kind == "sim" else _real_nccl()
        try:
            self.lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        except OSError as e:
            raise NcclError("dlopen", 2, f"{e}: install NCCL (pip install nvidia-nccl-cu13)") from e
        self.kind = kind
        L = self.lib  # noqa: N806
        L.ncclGetErrorString.restype = ctypes.c_char_p
        L.ncclGetLastError.restype = ctypes.c_char_p
        L.ncclGetLastError.argtypes = [c_void_p]
        L.ncclCommInitRank.argtypes = [POINTER(c_void_p), c_int, UniqueId, c_int]
        for name in ("ncclAllReduce", "ncclAllGather"):
            getattr(L, name).restype = c_int
        L.ncclAllReduce.argtypes = [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]
        L.ncclAllGather.argtypes = [c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p]

    def check(self, call: str, code: int, comm: int | None = None) -> None:
        if code:
            last = self.lib.ncclGetLastError(comm).decode(errors="replace")
            raise NcclError(call, code, last or self.lib.ncclGetErrorString(code).decode())

    def version(self) -> int:
        v = c_int()
        self.check("ncclGetVersion", self.lib.ncclGetVersion(byref(v)))
        return v.value

    def unique_id(self) -> bytes:
        uid = UniqueId()
        self.check("ncclGetUniqueId", self.lib.ncclGetUniqueId(byref(uid)))
        return ctypes.string_at(ctypes.addressof(uid), 128)  # NOTE: .internal stops at a NUL

    def init_rank(self, nranks: int, uid: bytes, rank: int) -> Communicator:
        """This process's rank of a communicator of NRANKS; every rank calls it with the same
        UID (from unique_id() on one of them, sent out of band)."""
        if len(uid) != 128:
            raise NcclError("ncclCommInitRank", 4, f"a unique id is 128 bytes, not {len(uid)}")
        comm = c_void_p()
        u = UniqueId()
        ctypes.memmove(ctypes.addressof(u), uid, 128)
        self.check("ncclCommInitRank", self.lib.ncclCommInitRank(byref(comm), nranks, u, rank))
        return Communicator(self, int(comm.value or 0), nranks, rank)


class Communicator:
    def __init__(self, nccl: Nccl, handle: int, nranks: int, rank: int) -> None:
        self.nccl, self.handle, self.nranks, self.rank = nccl, handle, nranks, rank

    def all_reduce(self, send: int, recv: int, count: int, dtype: str = "float32",
                   op: str = "sum", stream: int = 0) -> None:  # fmt: skip
        """recv = op over every rank's send (count elements; recv may be send)."""
        code = self.nccl.lib.ncclAllReduce(send, recv, count, DTYPES[dtype], OPS[op],
                                           self.handle, stream)  # fmt: skip
        self.nccl.check("ncclAllReduce", code, self.handle)

    def all_gather(self, send: int, recv: int, count: int, dtype: str = "float32",
                   stream: int = 0) -> None:  # fmt: skip
        """recv = every rank's send (count elements each), in rank order."""
        code = self.nccl.lib.ncclAllGather(send, recv, count, DTYPES[dtype], self.handle, stream)
        self.nccl.check("ncclAllGather", code, self.handle)

    def async_error(self) -> int:
        """ncclRemoteError (6) once a rank gave up waiting for another or aborted; else 0."""
        err = c_int()
        self.nccl.check(
            "ncclCommGetAsyncError",
            self.nccl.lib.ncclCommGetAsyncError(c_void_p(self.handle), byref(err)),
        )
        return err.value

    def destroy(self) -> None:
        if self.handle:
            self.nccl.check("ncclCommDestroy", self.nccl.lib.ncclCommDestroy(c_void_p(self.handle)))
            self.handle = 0
