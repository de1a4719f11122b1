"""A Python program using the CUDA ABI through ctypes, with the recorder's control API:
a paused region, phase marks, a capture, and a fork whose child must not touch the trace."""

import ctypes
import os
import struct

from medusa import trace
from medusa.cuda import load_backend

b = load_backend("sim")
b.load_kernels("simcuda_testkernels")
with trace.paused():
    scratch = b.malloc(1 << 16)  # not recorded
trace.mark("weights")
w = b.malloc(4096)
print("w:", w)
print("scratch:", scratch)
b.memcpy_htod(w, struct.pack("1024f", *range(1024)))
trace.mark("capture")
s = b.stream_create()
b.begin_capture(s)
b.launch("scale_inplace", 4, 256, [w, ctypes.c_float(0.5), 1024], stream=s)
g = b.end_capture(s)
b.graph_launch(b.graph_instantiate(g), s)
b.stream_synchronize(s)
pid = os.fork()
if pid == 0:
    b.malloc(64)  # in the child: must not reach the parent's trace
    os._exit(0)
os.waitpid(pid, 0)
print("sum:", sum(struct.unpack("1024f", b.memcpy_dtoh(w, 4096))))
print("active:", trace.active())
