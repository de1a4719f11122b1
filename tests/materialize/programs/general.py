"""A program whose graph has every hazard restore must handle: an address freed and handed out
again between launches, pointers inside a by-value struct, a device-side array of pointers
(made during the capture phase, so restore must save and relocate it), a buffer of that phase the
graph reaches only through that array (so its contents must be saved too), a pointer to a module
global, a VMM-mapped buffer, registered host memory, and memset and memcpy nodes. Device memory
is not cleared, as on a GPU: what the graph reads, the program wrote.

  python general.py record        set up, capture, replay; print the outputs
  python general.py restore DIR   set up, restore the graph from artifact DIR instead; same output
"""

import ctypes
import struct
import sys

from medusa import trace
from medusa.cuda import load_backend

N = 256
b = load_backend("sim")
b.load_kernels("simcuda_testkernels")
c_void_p, c_float, c_int = ctypes.c_void_p, ctypes.c_float, ctypes.c_int


class Axpy(ctypes.Structure):
    _fields_ = [("y", c_void_p), ("x", c_void_p), ("alpha", c_float), ("n", c_int)]


def floats(ptr, n=N):
    return struct.unpack(f"{n}f", b.memcpy_dtoh(ptr, 4 * n))


def module_global(name):
    """The device address of a global of the test-kernel module, as a CUDA 13 program gets it:
    the function's module (cuFuncGetModule: not the library the runtime loaded) holds it."""
    fn, mod = c_void_p(), c_void_p()
    addr, size = ctypes.c_uint64(), ctypes.c_size_t()
    b.call("cudaGetFuncBySymbol", ctypes.byref(fn), c_void_p(b.symbol("add_global_bias")))
    assert not driver(b"cuFuncGetModule", 11000, c_void_p, c_void_p)(ctypes.byref(mod), fn)
    get = driver(b"cuModuleGetGlobal", 3020, c_void_p, c_void_p, c_void_p, ctypes.c_char_p)
    assert not get(ctypes.byref(addr), ctypes.byref(size), mod, name)
    return addr.value


def driver(name, version, *argtypes):
    fn = c_void_p()
    args = [ctypes.c_char_p, c_void_p, ctypes.c_uint, ctypes.c_ulonglong, c_void_p]
    by_version = b._fn("cudaGetDriverEntryPointByVersion", c_int, args)
    if by_version(name, ctypes.byref(fn), version, 0, None):  # a 12.4 runtime has only:
        b.call("cudaGetDriverEntryPoint", name, ctypes.byref(fn), 0, None)
    return ctypes.CFUNCTYPE(c_int, *argtypes)(fn.value)


class Prop(ctypes.Structure):  # CUmemAllocationProp: pinned device memory on device 0
    _fields_ = [
        ("type", c_int),
        ("handles", c_int),
        ("loc_type", c_int),
        ("loc_id", c_int),
        ("win32", c_void_p),
        ("flags", ctypes.c_uint64),
    ]


class Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("loc_type", c_int), ("loc_id", c_int), ("flags", c_int)]


def vmm_buffer(size):
    """Reserve address space, back it with a physical allocation, map it read-write."""
    prop = Prop(1, 0, 1, 0, None, 0)
    gran, va, handle = ctypes.c_size_t(), ctypes.c_uint64(), ctypes.c_uint64()
    driver(b"cuMemGetAllocationGranularity", 10020, c_void_p, c_void_p, c_int)(
        ctypes.byref(gran), ctypes.byref(prop), 0
    )
    size = -(-size // gran.value) * gran.value
    driver(
        b"cuMemAddressReserve",
        10020,
        c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_uint64,
        ctypes.c_uint64,
    )(ctypes.byref(va), size, 0, 0, 0)
    driver(b"cuMemCreate", 10020, c_void_p, ctypes.c_size_t, c_void_p, ctypes.c_uint64)(
        ctypes.byref(handle), size, ctypes.byref(prop), 0
    )
    driver(
        b"cuMemMap",
        10020,
        ctypes.c_uint64,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_uint64,
        ctypes.c_uint64,
    )(va, size, 0, handle, 0)
    access = Access(1, 0, 3)
    driver(b"cuMemSetAccess", 10020, ctypes.c_uint64, ctypes.c_size_t, c_void_p, ctypes.c_size_t)(
        va, size, ctypes.byref(access), 1
    )
    return va.value


# ---- setup: what the program makes the same way whether it restores or not ----
trace.mark("setup")
w = b.malloc(4 * N)
y = b.malloc(4 * N)
out = b.malloc(4 * N)
bias2 = b.malloc(4)
b.memcpy_htod(w, struct.pack(f"{N}f", *[0.25 * i for i in range(N)]))
bias = module_global(b"bias")
mapped = vmm_buffer(4 * N)
pages = ctypes.create_string_buffer(4 * N + 4096)  # host memory the program owns, registered
registered = (ctypes.addressof(pages) + 4095) & ~4095
b.call("cudaHostRegister", c_void_p(registered), ctypes.c_size_t(4 * N), ctypes.c_uint(2))
registered_dev = c_void_p()  # mapped: its device address
b.call("cudaHostGetDevicePointer", ctypes.byref(registered_dev), c_void_p(registered), c_int(0))
stream = b.stream_create()

if sys.argv[1] == "record":
    trace.mark("graph_capture")
    tmp = b.malloc(4 * N)
    b.launch("scale_inplace", 1, 32, [tmp, c_float(0.0), N], stream=stream)
    b.free(tmp)
    reused = b.malloc(4 * N)  # most likely tmp's address again
    table = b.malloc(4 * N)  # no kernel names it: the graph reaches it through ptrs only
    b.memcpy_htod(table, struct.pack(f"{N}f", *[0.5 * i for i in range(N)]))
    ptrs = b.malloc(24)
    b.memcpy_htod(ptrs, struct.pack("<QQQ", w, reused, table))
    b.begin_capture(stream)
    b.call("cudaMemsetAsync", c_void_p(y), c_int(0), ctypes.c_size_t(4 * N), c_void_p(stream))
    b.launch("vector_add", 1, 32, [reused, w, w, N], stream=stream)  # reused = 2w
    b.launch("axpy_struct", 1, 32, [Axpy(y, reused, 1.5, N)], stream=stream)  # y = 3w
    b.launch("gather_ptrs", 1, 32, [out, ptrs, 3, N], stream=stream)  # out = w + 2w + 2w = 5w
    b.launch("vector_add", 1, 1, [bias2, bias, bias, 1], stream=stream)  # 2 * bias = 3.0
    b.launch("vector_add", 1, 32, [registered_dev.value, w, w, N], stream=stream)  # 2w
    b.call(
        "cudaMemcpyAsync",
        c_void_p(mapped),
        c_void_p(out),
        ctypes.c_size_t(4 * N),
        c_int(3),
        c_void_p(stream),
    )  # out -> the VMM buffer
    graph = b.graph_instantiate(b.end_capture(stream))
    trace.mark("ready")
else:
    from medusa.artifact import load_artifact
    from medusa.restore import Restorer

    trace.mark("graph_restore")
    graph = Restorer(load_artifact(sys.argv[2]), b).restore(stream).execs[0]

b.memset(out, 0, 4 * N)
b.memset(mapped, 0, 4 * N)
ctypes.memset(registered, 0, 4 * N)
b.graph_launch(graph, stream)
b.stream_synchronize(stream)
print(
    f"y {sum(floats(y)):.2f} out {sum(floats(out)):.2f} bias2 {floats(bias2, 1)[0]:.2f} "
    f"mapped {sum(floats(mapped)):.2f} "
    f"registered {sum(struct.unpack(f'{N}f', ctypes.string_at(registered, 4 * N))):.2f}"
)
