"""Back-end selection and the typed calls Python code makes into the CUDA ABI.

Libraries are loaded RTLD_GLOBAL and every symbol is looked up in the process's global scope (as
PyTorch's calls resolve), so an LD_PRELOAD interposer in front of the process sees these calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medusa import env
from medusa.cuda import paths
from medusa.cuda.errors import CudaError
from medusa.errors import RefusedError

c_void_p, c_size_t, c_int, c_uint = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint


class Dim3(ctypes.Structure):
    _fields_ = [("x", c_uint), ("y", c_uint), ("z", c_uint)]


def _dim3(v: int | Sequence[int]) -> Dim3:
    t = (v, 1, 1) if isinstance(v, int) else tuple(v) + (1,) * (3 - len(v))
    return Dim3(*t)


@dataclass
class Backend:
    """One loaded CUDA implementation: 'sim' (libsimcuda) or 'cuda' (libcudart + libcuda)."""

    kind: str
    libraries: list[Path]
    _handles: list[ctypes.CDLL] = field(default_factory=list, repr=False)
    _scope: ctypes.CDLL | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        mode = os.RTLD_NOW | os.RTLD_GLOBAL
        self._handles = [ctypes.CDLL(str(p), mode=mode) for p in self.libraries]
        self._scope = ctypes.CDLL(None)
        self._fn("cudaGetErrorName", ctypes.c_char_p, [c_int])

    # ---- plumbing ----
    def _fn(self, name: str, restype: Any, argtypes: list[Any]) -> Any:
        assert self._scope is not None
        f = getattr(self._scope, name)
        f.restype, f.argtypes = restype, argtypes
        return f

    def error_name(self, code: int) -> str:
        name: bytes = self._scope.cudaGetErrorName(code)  # type: ignore[union-attr]
        return name.decode()

    def call(self, name: str, *args: Any) -> None:
        """Calls a runtime function that returns cudaError_t and raises CudaError on failure."""
        f = getattr(self._scope, name)
        code = f(*args)
        if code:
            raise CudaError(name, code, self.error_name(code), self.last_message())

    def last_message(self) -> str:
        if self.kind != "sim":
            return ""
        f = self._fn("simcudaGetLastMessage", ctypes.c_char_p, [])
        msg: bytes = f()
        return msg.decode()

    def load_kernels(self, name: str) -> None:
        """Loads a kernel library into the global scope so its host stubs resolve: the CPU build
        lib<name>.so on simcuda, the nvcc build lib<name>_cuda.so on a GPU."""
        if self.kind == "sim":
            path = paths.library(name)
        else:
            try:
                path = paths.library(f"{name}_cuda")
            except FileNotFoundError as e:
                raise FileNotFoundError(
                    f"{e}: GPU kernels are built with `pip install . "
                    "--config-settings=cmake.define.MEDUSA_BUILD_CUDA=ON`"
                ) from None
        self._handles.append(ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL))
        self.libraries.append(path)

    def symbol(self, name: str) -> int:
        """Address of a host symbol (a kernel's host stub) in the global scope."""
        return int(ctypes.cast(getattr(self._scope, name), c_void_p).value or 0)

    # ---- device ----
    def device_count(self) -> int:
        n = c_int()
        self.call("cudaGetDeviceCount", ctypes.byref(n))
        return n.value

    def device_attribute(self, attr: int, device: int = 0) -> int:
        v = c_int()
        self.call("cudaDeviceGetAttribute", ctypes.byref(v), c_int(attr), c_int(device))
        return v.value

    def device_name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self._fn("cuDeviceGetName", c_int, [ctypes.c_char_p, c_int, c_int])
        self.mem_get_info()  # initialises the runtime, hence the driver
        code = self._scope.cuDeviceGetName(buf, 256, 0)  # type: ignore[union-attr]
        if code:
            raise CudaError("cuDeviceGetName", code, self.error_name(code))
        return buf.value.decode()

    def versions(self) -> tuple[int, int]:
        drv, rt = c_int(), c_int()
        self.call("cudaDriverGetVersion", ctypes.byref(drv))
        self.call("cudaRuntimeGetVersion", ctypes.byref(rt))
        return drv.value, rt.value

    def mem_get_info(self) -> tuple[int, int]:
        free, total = c_size_t(), c_size_t()
        self.call("cudaMemGetInfo", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def arena(self) -> tuple[int, int] | None:
        if self.kind != "sim":
            return None
        base, size = ctypes.c_uint64(), ctypes.c_uint64()
        f = self._fn("simcudaGetArenaInfo", c_int, [c_void_p, c_void_p])
        return (base.value, size.value) if f(ctypes.byref(base), ctypes.byref(size)) == 0 else None

    # ---- memory ----
    def malloc(self, size: int) -> int:
        p = c_void_p()
        self.call("cudaMalloc", ctypes.byref(p), c_size_t(size))
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        self.call("cudaFree", c_void_p(ptr))

    def memcpy_htod(self, dst: int, data: bytes | memoryview) -> None:
        buf = (ctypes.c_char * len(data)).from_buffer_copy(data)
        self.call("cudaMemcpy", c_void_p(dst), buf, c_size_t(len(data)), c_int(1))

    def memcpy_dtoh(self, src: int, size: int) -> bytes:
        buf = ctypes.create_string_buffer(size)
        self.call("cudaMemcpy", buf, c_void_p(src), c_size_t(size), c_int(2))
        return buf.raw

    def memset(self, dst: int, value: int, size: int) -> None:
        self.call("cudaMemset", c_void_p(dst), c_int(value), c_size_t(size))

    # ---- streams, launches, graphs ----
    def stream_create(self) -> int:
        s = c_void_p()
        self.call("cudaStreamCreate", ctypes.byref(s))
        return int(s.value or 0)

    def stream_synchronize(self, stream: int) -> None:
        self.call("cudaStreamSynchronize", c_void_p(stream))

    def launch(
        self,
        kernel: str,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        args: Sequence[Any],
        stream: int = 0,
        shared_mem: int = 0,
    ) -> None:
        """Launches the kernel whose host stub is the global symbol `kernel`."""
        holders = [
            a if isinstance(a, ctypes._SimpleCData | ctypes.Structure) else c_void_p(a)
            for a in args
        ]
        argv = (c_void_p * max(1, len(holders)))(
            *[ctypes.cast(ctypes.byref(h), c_void_p) for h in holders]
        )
        f = self._fn(
            "cudaLaunchKernel",
            c_int,
            [c_void_p, Dim3, Dim3, ctypes.POINTER(c_void_p), c_size_t, c_void_p],
        )
        code = f(
            c_void_p(self.symbol(kernel)),
            _dim3(grid),
            _dim3(block),
            argv,
            c_size_t(shared_mem),
            c_void_p(stream),
        )
        if code:
            raise CudaError(
                f"cudaLaunchKernel({kernel})", code, self.error_name(code), self.last_message()
            )

    def begin_capture(self, stream: int, mode: int = 0) -> None:
        self.call("cudaStreamBeginCapture", c_void_p(stream), c_int(mode))

    def end_capture(self, stream: int) -> int:
        g = c_void_p()
        self.call("cudaStreamEndCapture", c_void_p(stream), ctypes.byref(g))
        return int(g.value or 0)

    def graph_num_nodes(self, graph: int) -> int:
        n = c_size_t()
        self.call("cudaGraphGetNodes", c_void_p(graph), None, ctypes.byref(n))
        return n.value

    def graph_instantiate(self, graph: int) -> int:
        x = c_void_p()
        self.call("cudaGraphInstantiate", ctypes.byref(x), c_void_p(graph), ctypes.c_ulonglong(0))
        return int(x.value or 0)

    def graph_launch(self, exec_: int, stream: int) -> None:
        self.call("cudaGraphLaunch", c_void_p(exec_), c_void_p(stream))


DRIVER = "libcuda.so.1"


class NoDeviceError(RefusedError, RuntimeError):
    """MEDUSA_DEVICE=cuda on a machine without a usable CUDA driver and device."""


def _real_driver_problem() -> str | None:
    """Why the real driver cannot serve (None when libcuda.so.1 loads, initialises and reports
    at least one device)."""
    try:
        drv = ctypes.CDLL(DRIVER)
    except OSError:
        return "no CUDA driver (libcuda.so.1 is not installed)"
    code = drv.cuInit(0)
    if code != 0:
        return f"the CUDA driver found no usable device (cuInit returned {code})"
    n = c_int()
    if drv.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value == 0:
        return "the CUDA driver reports no device"
    return None


def _loaded_cudart() -> Path | None:
    """The libcudart this process has loaded already (PyTorch's, say), so calls go to one
    runtime instance."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "/libcudart.so" in path:
                    return Path(path)
    except OSError:
        pass
    return None


def _cudart_path() -> Path:
    loaded = _loaded_cudart()
    if loaded is not None:
        return loaded
    name = ctypes.util.find_library("cudart")
    for cand in ([name] if name else []) + ["/usr/local/cuda/lib64/libcudart.so"]:
        if cand and (Path(cand).is_file() or not cand.startswith("/")):
            return Path(cand)
    raise FileNotFoundError(
        "libcudart was not found; install the CUDA toolkit or set MEDUSA_DEVICE=sim"
    )


_loaded: Backend | None = None


def load_backend(kind: str | None = None) -> Backend:
    """Loads the back-end MEDUSA_DEVICE names (auto: a real GPU if present, else simcuda), once."""
    global _loaded
    kind = kind or env.DEVICE.get()
    if kind not in ("auto", "cuda", "sim"):
        raise ValueError(f"MEDUSA_DEVICE={kind!r}: expected auto, cuda or sim")
    if kind == "auto":
        kind = "sim" if _real_driver_problem() else "cuda"
    elif kind == "cuda" and _loaded is None:
        problem = _real_driver_problem()
        if problem:
            raise NoDeviceError(
                f"MEDUSA_DEVICE=cuda: {problem}; on a machine without a GPU use MEDUSA_DEVICE=sim "
                "(or auto)"
            )
    if _loaded is not None and _loaded.kind != kind:
        raise RuntimeError(f"back-end {_loaded.kind} is loaded already; cannot switch to {kind}")
    if _loaded is not None:
        return _loaded
    _loaded = Backend(kind, libraries(kind))
    return _loaded


def libraries(kind: str) -> list[Path]:
    """What back-end `kind` loads into the global scope: libsimcuda (runtime and driver), or
    libcudart and the driver, which libcudart opens privately (Python calls cuDeviceGetName)."""
    if kind == "sim":
        return [paths.library("simcuda")]
    return [_cudart_path(), Path(DRIVER)]
