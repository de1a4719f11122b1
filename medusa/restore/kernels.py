"""Kernels and module globals for a restore: each function of the plan found in this process (an
exported stub, an image the process loaded, or the image saved in the artifact) with its
attributes re-applied, and each module global's address."""

from __future__ import annotations

import ctypes
from collections import Counter
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
from functools import cached_property
from typing import Any

import numpy as np

from medusa.artifact import Artifact
from medusa.cuda.backend import Backend
from medusa.restore.errors import RestoreError
from medusa.trace.reader import Trace

Images = dict[str, tuple[int, bool]]  # sha256 -> (handle, is_library)
_PTR = POINTER(c_void_p)
_STRS = POINTER(c_char_p)


def driver_fn(b: Backend, name: str, version: int, restype: Any, argtypes: list[Any]) -> Any:
    """The driver's NAME (as of VERSION), through the runtime, as a ctypes function."""
    fn = c_void_p()
    by_version = b._fn(
        "cudaGetDriverEntryPointByVersion",
        c_int,
        [c_char_p, c_void_p, c_uint, ctypes.c_ulonglong, c_void_p],
    )
    if by_version(name.encode(), ctypes.byref(fn), version, 0, None):
        # NOTE: a runtime older than 12.5 has only the unversioned lookup.
        b.call(
            "cudaGetDriverEntryPoint",
            c_char_p(name.encode()),
            ctypes.byref(fn),
            ctypes.c_ulonglong(0),
            None,
        )
    if not fn.value:
        raise RestoreError(f"the driver has no {name}")
    return ctypes.CFUNCTYPE(restype, *argtypes)(fn.value)


class KernelFinder:
    """The driver calls that find a kernel, and the images this process holds (`libs`): those it
    loaded (read from its own trace), and those loaded from the artifact along the way."""

    def __init__(self, b: Backend, art: Artifact, own: Trace, lib: ctypes.CDLL) -> None:
        """lib: libmedusa_restore, whose mr_find_stubs and mr_image_function make the driver
        calls that find a kernel (its driver functions looked up once, in C)."""
        self.b, self.art, self._own = b, art, own
        self._get_by_stub = b._fn("cudaGetFuncBySymbol", c_int, [c_void_p, c_void_p])
        self._find_stubs = lib.mr_find_stubs
        self._find_stubs.argtypes = [c_uint, _STRS, _STRS, c_void_p, POINTER(c_uint64)]
        self._find_stubs.restype = c_int
        self._in_image = lib.mr_image_function
        self._in_image.argtypes = [c_void_p, c_int, c_char_p, _PTR]
        self._in_image.restype = c_int

    # NOTE: each driver function is looked up when first used: a restore whose kernels all have
    # an exported stub needs two of them, and each lookup is a visible share of a restore.
    @cached_property
    def libs(self) -> Images:
        libs: Images = {}
        for handle, is_library, sha256 in self._own.loads():
            libs.setdefault(sha256, (handle, is_library))
        return libs

    def _function(self, handle: int, is_library: bool, name: str, f: c_void_p) -> bool:
        """F := the function NAME of a loaded library or module; whether it has one. A library
        gives a CUkernel, and graph nodes and cuFuncSetAttribute take its CUfunction."""
        code = self._in_image(c_void_p(handle), is_library, name.encode(), ctypes.byref(f))
        if code == -1:
            call = "cuLibraryGetKernel" if is_library else "cuModuleGetFunction"
            raise RestoreError(f"the driver has no {call}")
        return code == 0

    @cached_property
    def load_data(self) -> Any:
        args = [_PTR, c_char_p, c_void_p, c_void_p, c_uint, c_void_p, c_void_p, c_uint]
        return driver_fn(self.b, "cuLibraryLoadData", 12000, c_int, args)

    @cached_property
    def set_attr(self) -> Any:
        return driver_fn(self.b, "cuFuncSetAttribute", 9000, c_int, [c_void_p, c_int, c_int])

    @cached_property
    def _error_name(self) -> Any:
        return driver_fn(self.b, "cuGetErrorName", 6000, c_int, [c_int, POINTER(c_char_p)])

    def error(self, call: str, code: int) -> str:
        """A driver call's failure as the driver names it: "call: CUDA_ERROR_X (n)"."""
        name = c_char_p()
        if self._error_name(code, ctypes.byref(name)) or not name.value:
            return f"{call}: CUDA error {code}"
        return f"{call}: {name.value.decode()} ({code})"

    def by_stubs(self, funcs: list[dict[str, Any]]) -> list[int]:
        """Each of the plan's functions found through its exported host stub (the runtime's
        cudaGetFuncBySymbol, its name checked with cuFuncGetName), 0 where it is not; all in one
        call (mr_find_stubs: a few ctypes calls per kernel were a visible share of a restore)."""
        n = len(funcs)
        # NOTE: a name with a NUL in it is no C string: never found through a stub.
        plain = [bool(f["symbol"]) and "\0" not in f["symbol"] + f["name"] for f in funcs]
        symbols = [f["symbol"].encode() if ok else None for f, ok in zip(funcs, plain, strict=True)]
        out = (c_uint64 * max(n, 1))()
        stub = ctypes.cast(self._get_by_stub, c_void_p)
        names = (c_char_p * max(n, 1))(*[f["name"].encode() for f in funcs])
        if self._find_stubs(n, (c_char_p * max(n, 1))(*symbols), names, stub, out) == -1:
            raise RestoreError("the driver has no cuFuncGetName")
        return out[:n]

    def find(self, fn: dict[str, Any]) -> tuple[c_void_p, str]:
        """The CUfunction of the plan's function FN not found through a stub (by_stubs), and
        how it was found."""
        f = c_void_p()
        method = self._in_loaded(fn, f)
        if method:
            return f, method
        why = self._from_saved(fn, f)
        if why is None:
            return f, "saved image"
        raise RestoreError(
            f"kernel {fn['name']} (image {fn['sha256'][:12]}) cannot be found: no exported "
            f"symbol names it, no loaded image holds it, and {why}"
        )

    def _in_loaded(self, fn: dict[str, Any], f: c_void_p) -> str:
        if fn["sha256"] not in self.libs:
            return ""
        handle, is_lib = self.libs[fn["sha256"]]
        return "loaded image" if self._function(handle, is_lib, fn["name"], f) else ""

    def _from_saved(self, fn: dict[str, Any], f: c_void_p) -> str | None:
        """None once found in the image the artifact saved; else why not."""
        sha = fn["sha256"]
        image = self.art.image(sha)
        if not image:
            return "no image of it was saved"
        lib = c_void_p()
        code = self.load_data(ctypes.byref(lib), image, None, None, 0, None, None, 0)
        if code:
            message = self.b.last_message()
            return f"its saved image does not load ({self.error('cuLibraryLoadData', code)}" + (
                f": {message})" if message else ")"
            )
        if self._function(int(lib.value or 0), True, fn["name"], f):
            self.libs[sha] = (int(lib.value or 0), True)
            return None
        return "its saved image does not hold it"


def find_kernels(
    finder: KernelFinder, funcs: list[dict[str, Any]]
) -> tuple[np.ndarray, Counter[str]]:
    """The plan's functions as CUfunctions, their attributes re-applied; how many each way."""
    out = np.zeros(len(funcs), np.uint64)
    methods: Counter[str] = Counter()
    stubs = finder.by_stubs(funcs)
    for i, fn in enumerate(funcs):
        f, method = (c_void_p(stubs[i]), "exported stub") if stubs[i] else finder.find(fn)
        for attr, value in fn["attrs"]:
            if code := finder.set_attr(f, attr, value):
                raise RestoreError(
                    f"kernel {fn['name']}: re-applying attribute {attr}={value} failed "
                    f"({finder.error('cuFuncSetAttribute', code)})"
                )
        out[i] = f.value or 0
        methods[method] += 1
    return out, methods


def global_addresses(b: Backend, globals_: list[dict[str, Any]], libs: Images) -> np.ndarray:
    """Where each of the plan's module globals lives in this process, by its index."""
    size = max((g["index"] for g in globals_), default=-1) + 1
    base = np.zeros(size, np.uint64)
    if not globals_:
        return base
    argtypes = [POINTER(c_uint64), POINTER(c_size_t), c_void_p, c_char_p]
    lib_global = driver_fn(b, "cuLibraryGetGlobal", 12000, c_int, argtypes)
    mod_global = driver_fn(b, "cuModuleGetGlobal", 3020, c_int, argtypes)
    for g in globals_:
        handle, is_lib = libs.get(g["sha256"], (0, True))
        addr, n = c_uint64(), c_size_t()
        look = lib_global if is_lib else mod_global
        if not handle or look(
            ctypes.byref(addr), ctypes.byref(n), c_void_p(handle), g["name"].encode()
        ):
            raise RestoreError(f"module global {g['name']} (image {g['sha256'][:12]}) not found")
        base[g["index"]] = addr.value
    return base
