"""The engine's view of the device: memory, kernel launches, the BLAS, streams and graphs, all
through the CUDA ABI (simcuda or a GPU), so the recorder sees every call."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import c_float, c_int, c_int64, c_size_t, c_void_p
from dataclasses import dataclass
from typing import Any

import numpy as np

from medusa.cuda import CudaError, load_backend
from medusa.cuda.backend import Backend, Dim3
from medusa.engine.hybrid_gemm import Tiles, launch_shape

# Kernel signatures (as csrc/kernels/cpu/engine.c registers them): p pointer, i int, f float.
KERNELS = {
    "embed_tokens": "p p p i i",
    "rms_norm_kernel": "p p p i i f",
    "rotary_embedding": "p p p i i i i i p i f i",
    "reshape_and_cache_kernel": "p p p p p i i i i i i",
    "paged_attention_kernel": "p p p p p p p i i i i i i i f i",
    "silu_and_mul_kernel": "p p i i",
    "add_bias_kernel": "p p i i",
    "add_inplace_kernel": "p p i",
    "gather_rows_kernel": "p p p i i",
    "hybrid_gemm_kernel": "p p p i i i i i i i i i i i",
    "sample_tokens_kernel": "p p p p p i i",
}
# cudaHostRegister flags (driver_types.h).
_HOST_REGISTER_MAPPED, _HOST_REGISTER_READ_ONLY = 0x02, 0x08
_CTYPES: dict[str, Callable[[Any], ctypes._SimpleCData[Any]]] = {
    "p": c_void_p, "i": c_int, "f": c_float, "l": c_int64
}  # fmt: skip

# Blocks per launch on a GPU (the CUDA kernels loop grid-stride, so any count is correct; these
# give one block per token or row). On simcuda a kernel runs its whole grid in one call anyway.
GRID_RULES = {
    "embed_tokens": lambda a: a[3],
    "rms_norm_kernel": lambda a: a[3],
    "rotary_embedding": lambda a: a[3],
    "reshape_and_cache_kernel": lambda a: a[5],
    "paged_attention_kernel": lambda a: 256,  # rows x heads over 128 threads, capped
    "silu_and_mul_kernel": lambda a: a[2],
    "add_bias_kernel": lambda a: a[2],
    "add_inplace_kernel": lambda a: -(-a[2] // 128),
    "gather_rows_kernel": lambda a: a[3],
    "sample_tokens_kernel": lambda a: a[5],
}


@dataclass(frozen=True)
class Buffer:
    ptr: int
    nbytes: int

    def at(self, offset: int) -> int:
        return self.ptr + offset


class Device:
    def __init__(self, backend: Backend | None = None) -> None:
        self.b = backend or load_backend()
        self.b.load_kernels("medusa_kernels")
        self.b.load_kernels("medusa_blas")
        scope = ctypes.CDLL(None)
        self._launch = scope.cudaLaunchKernel
        self._launch.restype = c_int
        self._launch.argtypes = [c_void_p, Dim3, Dim3, ctypes.POINTER(c_void_p), c_size_t, c_void_p]
        self._stubs = {k: self.b.symbol(k) for k in KERNELS}
        self._types = {k: [_CTYPES[c] for c in sig.split()] for k, sig in KERNELS.items()}
        self._gemm = scope.mblas_sgemm
        self._gemm.restype = c_int
        self._gemm.argtypes = [c_int, c_int, c_int, c_int, c_int, c_float, c_void_p, c_int,
                               c_void_p, c_int, c_float, c_void_p, c_int, c_void_p]  # fmt: skip
        self._memcpy = scope.cudaMemcpy
        self._memcpy.restype = c_int
        self._memcpy.argtypes = [c_void_p, c_void_p, c_size_t, c_int]
        self.stream = self.b.stream_create()
        self._host: dict[int, int] = {}  # device address -> host address of host_alloc buffers
        self._registered: dict[int, int] = {}  # host address -> device address of host_register

    @property
    def kind(self) -> str:
        return self.b.kind

    # ---- memory ----
    def alloc(self, nbytes: int) -> Buffer:
        return Buffer(self.b.malloc(max(nbytes, 1)), nbytes)

    def mem_info(self) -> tuple[int, int]:
        return self.b.mem_get_info()

    def upload(self, dst: int | Buffer, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        if isinstance(dst, Buffer) and arr.nbytes > dst.nbytes:  # a GPU would overwrite silently
            raise ValueError(f"upload of {arr.nbytes} bytes into a buffer of {dst.nbytes}")
        ptr = dst.ptr if isinstance(dst, Buffer) else dst
        self._check("cudaMemcpy", self._memcpy(ptr, arr.ctypes.data, arr.nbytes, 1))

    def download(self, src: int | Buffer, dtype: np.dtype | type, count: int) -> np.ndarray:
        out = np.empty(count, dtype=dtype)
        ptr = src.ptr if isinstance(src, Buffer) else src
        self._check("cudaMemcpy", self._memcpy(out.ctypes.data, ptr, out.nbytes, 2))
        return out

    # ---- work ----
    def launch(
        self,
        kernel: str,
        *args: int | float,
        grid: int | tuple[int, int] | None = None,
        block: int = 128,
        shared: int = 0,
    ) -> None:
        holders = [t(a) for t, a in zip(self._types[kernel], args, strict=True)]
        argv = (c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        if grid is None:
            rule = GRID_RULES.get(kernel)
            grid = max(1, min(65535, int(rule(args)))) if rule else 1
        gx, gy = (grid, 1) if isinstance(grid, int) else grid
        code = self._launch(
            self._stubs[kernel], Dim3(gx, gy, 1), Dim3(block, 1, 1), argv, shared, self.stream
        )
        self._check(f"cudaLaunchKernel({kernel})", code)

    def linear(
        self, out: int, x: int, w: int, m: int, n: int, k: int, *, accumulate: bool = False
    ) -> None:
        """out[m, n] (+)= x[m, k] @ w[n, k]^T, as an nn.Linear does."""
        code = self._gemm(0, 1, m, n, k, 1.0, x, k, w, k, 1.0 if accumulate else 0.0, out, n,
                          self.stream)  # fmt: skip
        self._check("mblas_sgemm", code)

    def host_alloc(self, nbytes: int) -> Buffer:
        """Pinned host memory mapped into the device's address space (C2C-readable on a
        superchip); the Buffer holds its device address."""
        p, d = c_void_p(), c_void_p()
        self.b.call("cudaHostAlloc", ctypes.byref(p), c_size_t(max(nbytes, 1)), ctypes.c_uint(2))
        self.b.call("cudaHostGetDevicePointer", ctypes.byref(d), p, ctypes.c_uint(0))
        self._host[int(d.value or 0)] = int(p.value or 0)
        return Buffer(int(d.value or 0), nbytes)

    def host_register(self, host_addr: int, nbytes: int, *, read_only: bool = True) -> int:
        """Registers memory the caller owns (e.g. a shared, read-only file mapping) for device
        access and returns its device address. read_only registers it as the device may only
        read it (required for a PROT_READ mapping); the caller keeps the mapping alive until
        host_unregister."""
        if nbytes <= 0:
            raise ValueError(f"host_register of {nbytes} bytes at {host_addr:#x}: need nbytes > 0")
        if host_addr in self._registered:
            raise ValueError(f"host_register: {host_addr:#x} is already registered")
        flags = _HOST_REGISTER_MAPPED | (_HOST_REGISTER_READ_ONLY if read_only else 0)
        self.b.call("cudaHostRegister", c_void_p(host_addr), c_size_t(nbytes), ctypes.c_uint(flags))
        d = c_void_p()
        try:
            self.b.call("cudaHostGetDevicePointer", ctypes.byref(d), c_void_p(host_addr),
                        ctypes.c_uint(0))  # fmt: skip
        except CudaError:
            self.b.call("cudaHostUnregister", c_void_p(host_addr))
            raise
        self._registered[host_addr] = int(d.value or 0)
        return self._registered[host_addr]

    def host_unregister(self, host_addr: int) -> None:
        """Ends a host_register; the device address it returned is invalid afterwards."""
        if host_addr not in self._registered:
            raise ValueError(
                f"host_unregister: {host_addr:#x} is not the host address of a host_register"
            )
        self.b.call("cudaHostUnregister", c_void_p(host_addr))
        del self._registered[host_addr]

    def free(self, buf: Buffer) -> None:
        if buf.ptr in self._registered.values():
            # NOTE: registered memory belongs to whoever mapped it: cudaFree/cudaFreeHost on it
            # would be an error on a GPU, and freeing the mapping is the owner's business.
            raise ValueError(
                f"free: {buf.ptr:#x} is registered host memory; use host_unregister(host address)"
            )
        host = self._host.pop(buf.ptr, None)
        if host is not None:
            self.b.call("cudaFreeHost", c_void_p(host))
        else:
            self.b.free(buf.ptr)

    def hybrid_linear(
        self, out: int, x: int, w: int, m: int, n: int, k: int, alpha: float, tiles: Tiles
    ) -> None:
        """out[m, n] = x[m, k] @ w[n, k]^T by HybridGEMM (w host-mapped), alpha: output-stationary
        share of the columns."""
        ints, grid, shared = launch_shape(m, n, k, alpha, tiles)
        if ints[3] < n:  # NOTE: the weight-stationary columns accumulate: they must start at zero
            self.b.call(
                "cudaMemsetAsync", c_void_p(out), ctypes.c_int(0), c_size_t(m * n * 4),
                c_void_p(self.stream),
            )  # fmt: skip
        self.launch("hybrid_gemm_kernel", out, x, w, *ints, grid=grid, block=256, shared=shared)

    def synchronize(self) -> None:
        self.b.stream_synchronize(self.stream)

    # ---- graphs ----
    def begin_capture(self) -> None:
        self.b.begin_capture(self.stream)

    def end_capture(self) -> int:
        return self.b.end_capture(self.stream)

    def instantiate(self, graph: int) -> int:
        return self.b.graph_instantiate(graph)

    def replay(self, exec_: int) -> None:
        self.b.graph_launch(exec_, self.stream)

    def destroy_exec(self, exec_: int) -> None:
        self.b.call("cudaGraphExecDestroy", c_void_p(exec_))

    def _check(self, what: str, code: int) -> None:
        if code:
            raise CudaError(what, code, self.b.error_name(code), self.b.last_message())
