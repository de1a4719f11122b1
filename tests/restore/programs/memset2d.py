"""A program whose graph fills a pitched region (cudaMemset2DAsync: ROWS rows of WIDTH bytes,
PITCH bytes apart) and then scales another buffer. The recording keeps no pitch, so materialize
must refuse the graph rather than restore a fill of the wrong bytes.

  python memset2d.py record   set up, capture, replay; print what the fill left
"""

import ctypes
import struct

from medusa import trace
from medusa.cuda import load_backend

PITCH, WIDTH, ROWS, N = 256, 100, 4, 64
b = load_backend("sim")
b.load_kernels("simcuda_testkernels")
c_void_p, c_size_t = ctypes.c_void_p, ctypes.c_size_t

trace.mark("setup")
grid = b.malloc(PITCH * ROWS)
x = b.malloc(4 * N)
b.memcpy_htod(x, struct.pack(f"{N}f", *range(N)))
stream = b.stream_create()

trace.mark("graph_capture")
b.begin_capture(stream)
b.call("cudaMemset2DAsync", c_void_p(grid), c_size_t(PITCH), ctypes.c_int(0x11), c_size_t(WIDTH),
       c_size_t(ROWS), c_void_p(stream))  # fmt: skip
b.launch("scale_inplace", 1, 64, [x, ctypes.c_float(2.0), N], stream=stream)
graph = b.graph_instantiate(b.end_capture(stream))

trace.mark("ready")
b.memset(grid, 0xAB, PITCH * ROWS)
b.graph_launch(graph, stream)
b.stream_synchronize(stream)
data = b.memcpy_dtoh(grid, PITCH * ROWS)
rows = [data[r * PITCH : (r + 1) * PITCH] for r in range(ROWS)]
filled = sum(r[:WIDTH] == b"\x11" * WIDTH for r in rows)
kept = sum(r[WIDTH:] == b"\xab" * (PITCH - WIDTH) for r in rows)
scaled = sum(struct.unpack(f"{N}f", b.memcpy_dtoh(x, 4 * N)))
print(f"rows filled {filled} gaps kept {kept} x {scaled:.1f}")
