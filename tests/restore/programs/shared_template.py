"""Graphs of one topology that differ in a kernel's arguments or in a fill's value. Restore builds
the first node by node and the next from it, setting only the kernels that differ; a graph whose
fill differs is built anew (and the one after it from that one). Each must compute what its
captured graph did.

  python shared_template.py record        capture the graphs, launch each; print their outputs
  python shared_template.py restore DIR   restore them from artifact DIR instead; same output
"""

import ctypes
import struct
import sys

from medusa import trace
from medusa.cuda import load_backend

N = 64
b = load_backend("sim")
b.load_kernels("simcuda_testkernels")
c_void_p, c_int = ctypes.c_void_p, ctypes.c_int
# (fill byte, output) per graph: 1 differs from 0 in its kernel's output, 2 from 1 in its fill,
# 3 from 2 in its kernel's output again.
GRAPHS = [(0, 0), (0, 1), (0x40, 2), (0x40, 3)]

trace.mark("setup")
x = b.malloc(4 * N)
b.memcpy_htod(x, struct.pack(f"{N}f", *range(N)))
fill = b.malloc(4 * N)
outs = [b.malloc(4 * N) for _ in GRAPHS]
stream = b.stream_create()


def capture(value: int, out: int) -> int:
    b.begin_capture(stream)
    size = ctypes.c_size_t(4 * N)
    b.call("cudaMemsetAsync", c_void_p(fill), c_int(value), size, c_void_p(stream))
    b.launch("vector_add", 1, 32, [out, fill, x, N], stream=stream)  # out = fill + x
    return b.graph_instantiate(b.end_capture(stream))


if sys.argv[1] == "record":
    trace.mark("graph_capture")
    graphs = [capture(value, outs[o]) for value, o in GRAPHS]
    trace.mark("ready")
else:
    from medusa.artifact import load_artifact
    from medusa.restore import Restorer

    trace.mark("graph_restore")
    graphs = Restorer(load_artifact(sys.argv[2]), b).restore(stream).execs

sums = []
for graph, out in zip(graphs, outs, strict=True):
    b.memset(out, 0, 4 * N)
    b.graph_launch(graph, stream)
    b.stream_synchronize(stream)
    sums.append(f"{sum(struct.unpack(f'{N}f', b.memcpy_dtoh(out, 4 * N))):.3f}")
print(" ".join(sums))
