"""CUDA virtual memory management through the driver's entry points (real driver or simcuda):
reserve address space, create physical pages, map them, grant access, unmap and release. What the
elastic KV cache is made of."""

from __future__ import annotations

import ctypes
from ctypes import byref, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p
from typing import Any

from medusa.cuda import CudaError
from medusa.cuda.backend import Backend

PINNED, ON_DEVICE, READ_WRITE = 1, 1, 3  # CU_MEM_ALLOCATION_TYPE_PINNED, ..._LOCATION_TYPE_DEVICE


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [
        ("type", c_int), ("handle_types", c_int), ("loc_type", c_int), ("loc_id", c_int),
        ("win32", c_void_p), ("compression", ctypes.c_ubyte), ("gpu_direct", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4),
    ]  # fmt: skip


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("loc_type", c_int), ("loc_id", c_int), ("flags", c_int)]


class Vmm:
    """The VMM calls of device `device` (ordinal) of `backend`; each raises CudaError."""

    def __init__(self, backend: Backend, device: int = 0) -> None:
        self.b = backend
        self._prop = _Prop(type=PINNED, loc_type=ON_DEVICE, loc_id=device)
        self._access = _Access(ON_DEVICE, device, READ_WRITE)
        u64, size = c_uint64, c_size_t
        self._gran = self._entry("cuMemGetAllocationGranularity", c_void_p, c_void_p, c_int)
        self._reserve = self._entry("cuMemAddressReserve", c_void_p, size, size, u64, u64)
        self._free = self._entry("cuMemAddressFree", u64, size)
        self._create = self._entry("cuMemCreate", c_void_p, size, c_void_p, u64)
        self._release = self._entry("cuMemRelease", u64)
        self._map = self._entry("cuMemMap", u64, size, size, u64, u64)
        self._unmap = self._entry("cuMemUnmap", u64, size)
        self._set_access = self._entry("cuMemSetAccess", u64, size, c_void_p, size)
        g = c_size_t()
        self._check("cuMemGetAllocationGranularity", self._gran(byref(g), byref(self._prop), 0))
        self.granularity = g.value

    def _entry(self, name: str, *argtypes: Any) -> Any:
        fn = c_void_p()
        get = self.b._fn(
            "cudaGetDriverEntryPointByVersion",
            c_int,
            [ctypes.c_char_p, c_void_p, c_uint, c_ulonglong, c_void_p],
        )
        code = get(name.encode(), byref(fn), 12000, 0, None)
        if code or not fn.value:
            raise CudaError(f"cudaGetDriverEntryPointByVersion({name})", code or 500, "not found")
        return ctypes.CFUNCTYPE(c_int, *argtypes)(fn.value)

    def _check(self, call: str, code: int) -> None:
        if code:
            raise CudaError(call, code, f"CUresult {code}", self.b.last_message())

    def reserve(self, size: int) -> int:
        va = c_uint64()
        self._check("cuMemAddressReserve", self._reserve(byref(va), size, 0, 0, 0))
        return va.value

    def free_range(self, va: int, size: int) -> None:
        self._check("cuMemAddressFree", self._free(va, size))

    def create(self, size: int) -> int:
        h = c_uint64()
        self._check("cuMemCreate", self._create(byref(h), size, byref(self._prop), 0))
        return h.value

    def release(self, handle: int) -> None:
        self._check("cuMemRelease", self._release(handle))

    def map(self, va: int, size: int, handle: int) -> None:
        self._check("cuMemMap", self._map(va, size, 0, handle, 0))

    def set_access(self, va: int, size: int) -> None:
        """Read-write access from the device (a mapping is unusable until granted)."""
        self._check("cuMemSetAccess", self._set_access(va, size, byref(self._access), 1))

    def unmap(self, va: int, size: int) -> None:
        self._check("cuMemUnmap", self._unmap(va, size))
