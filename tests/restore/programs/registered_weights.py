"""Weights in a read-only file mapping registered for the device (as `--weights host` shares its
weight store between workers), read by a captured graph: at the start and at an offset inside the
registration. The mapping lands at a different address in every process.

  python registered_weights.py record FILE        set up, capture, replay; print the outputs
  python registered_weights.py restore FILE DIR   set up, restore the graph from DIR instead
"""

import ctypes
import mmap
import os
import struct
import sys

from medusa import trace
from medusa.cuda import load_backend

N = 1024
SKIP = 16  # the second kernel reads the weights from element SKIP on
b = load_backend("sim")
b.load_kernels("simcuda_testkernels")
c_void_p, c_int = ctypes.c_void_p, ctypes.c_int
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = c_void_p
libc.mmap.argtypes = [c_void_p, ctypes.c_size_t, c_int, c_int, c_int, ctypes.c_long]


def floats(ptr, n=N):
    return struct.unpack(f"{n}f", b.memcpy_dtoh(ptr, 4 * n))


def map_weights(path):
    """PROT_READ, MAP_SHARED, after a mapping of random size so that the address differs."""
    pad = mmap.mmap(-1, mmap.PAGESIZE * (1 + int.from_bytes(os.urandom(2), "little")))
    fd = os.open(path, os.O_RDONLY)
    addr = libc.mmap(None, 4 * N, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    return addr, pad


trace.mark("setup")
host, _pad = map_weights(sys.argv[2])
flags = 0x02 | 0x08  # cudaHostRegisterMapped | cudaHostRegisterReadOnly
b.call("cudaHostRegister", c_void_p(host), ctypes.c_size_t(4 * N), ctypes.c_uint(flags))
weights = c_void_p()
b.call("cudaHostGetDevicePointer", ctypes.byref(weights), c_void_p(host), c_int(0))
w = weights.value
x = b.malloc(4 * N)
out = b.malloc(4 * N)
tail = b.malloc(4 * N)
b.memcpy_htod(x, struct.pack(f"{N}f", *[1.0] * N))
stream = b.stream_create()

if sys.argv[1] == "record":
    trace.mark("graph_capture")
    b.begin_capture(stream)
    b.launch("vector_add", 4, 256, [out, x, w, N], stream=stream)  # out = 1 + w
    b.launch("vector_add", 4, 256, [tail, x, w + 4 * SKIP, N - SKIP], stream=stream)
    graph = b.graph_instantiate(b.end_capture(stream))
    trace.mark("ready")
else:
    from medusa.artifact import load_artifact
    from medusa.restore import Restorer

    trace.mark("graph_restore")
    graph = Restorer(load_artifact(sys.argv[3]), b).restore(stream).execs[0]

b.memset(out, 0, 4 * N)
b.memset(tail, 0, 4 * N)
b.graph_launch(graph, stream)
b.stream_synchronize(stream)
print(f"weights at {host:#x}")
print(f"out {sum(floats(out)):.2f} tail {sum(floats(tail, N - SKIP)):.2f}")
b.call("cudaHostUnregister", c_void_p(host))
