"""A program whose graph holds a cooperative kernel with an access-policy window, and whose
start-up goes on after the graph stage (a "serve" phase allocates after it, as vLLM's later
phases do after capture_model).

  python launch_attrs.py record        set up, capture, go on; print the output
  python launch_attrs.py restore DIR   set up, restore the graph from artifact DIR; same output
"""

import ctypes
import struct
import sys

from medusa import trace
from medusa.cuda import load_backend

N = 256
COOPERATIVE, ACCESS_POLICY_WINDOW = 2, 1  # CUlaunchAttributeID
b = load_backend("sim")
b.load_kernels("simcuda_testkernels")
c_void_p, c_uint = ctypes.c_void_p, ctypes.c_uint


class Window(ctypes.Structure):  # CUaccessPolicyWindow
    _fields_ = [("base_ptr", c_void_p), ("num_bytes", ctypes.c_size_t),
                ("hit_ratio", ctypes.c_float), ("hit_prop", ctypes.c_int),
                ("miss_prop", ctypes.c_int)]  # fmt: skip


class Value(ctypes.Union):  # CUlaunchAttributeValue
    _fields_ = [("pad", ctypes.c_char * 64), ("window", Window), ("cooperative", ctypes.c_int)]


class Attr(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", Value)]


class Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", c_uint * 3), ("block", c_uint * 3), ("shared", c_uint),
                ("stream", c_void_p), ("attrs", ctypes.POINTER(Attr)),
                ("num_attrs", c_uint)]  # fmt: skip


def launch_ex(stream: int, x: int, window: int) -> None:
    """scale_inplace(x, 2, N) as a cooperative launch with an access-policy window on `window`."""
    fn, get = c_void_p(), c_void_p()
    b.call("cudaGetFuncBySymbol", ctypes.byref(fn), c_void_p(b.symbol("scale_inplace")))
    args = [ctypes.c_char_p, c_void_p, c_uint, ctypes.c_ulonglong, c_void_p]
    by_version = b._fn("cudaGetDriverEntryPointByVersion", ctypes.c_int, args)
    if by_version(b"cuLaunchKernelEx", ctypes.byref(get), 12000, 0, None):  # a 12.4 runtime:
        b.call("cudaGetDriverEntryPoint", b"cuLaunchKernelEx", ctypes.byref(get), 0, None)
    attrs = (Attr * 2)()
    attrs[0].id, attrs[0].value.cooperative = COOPERATIVE, 1
    attrs[1].id = ACCESS_POLICY_WINDOW
    attrs[1].value.window = Window(window, 4 * N, 1.0, 2, 1)  # persisting hits, streaming misses
    cfg = Config((1, 1, 1), (32, 1, 1), 0, stream, attrs, 2)
    xp, s, n = c_void_p(x), ctypes.c_float(2.0), ctypes.c_int(N)
    args = (c_void_p * 3)(*[ctypes.cast(ctypes.byref(v), c_void_p) for v in (xp, s, n)])
    launch = ctypes.CFUNCTYPE(ctypes.c_int, c_void_p, c_void_p, c_void_p, c_void_p)(get.value)
    code = launch(ctypes.byref(cfg), fn, args, None)
    if code:
        raise RuntimeError(f"cuLaunchKernelEx: error {code}")


trace.mark("setup")
x = b.malloc(4 * N)
hot = b.malloc(4 * N)
b.memcpy_htod(x, struct.pack(f"{N}f", *[float(i) for i in range(N)]))
stream = b.stream_create()

if sys.argv[1] == "record":
    trace.mark("graph_capture")
    b.begin_capture(stream)
    launch_ex(stream, x, hot)
    graph = b.graph_instantiate(b.end_capture(stream))
else:
    from medusa.artifact import load_artifact
    from medusa.restore import Restorer

    trace.mark("graph_restore")
    graph = Restorer(load_artifact(sys.argv[2]), b).restore(stream).execs[0]

trace.mark("serve")
later = [b.malloc(4096) for _ in range(3)]
b.graph_launch(graph, stream)
b.stream_synchronize(stream)
print(f"x {sum(struct.unpack(f'{N}f', b.memcpy_dtoh(x, 4 * N))):.2f} later {len(later)}")
