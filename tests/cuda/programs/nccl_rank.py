"""One rank of a communicator on simcuda (libmedusa_nccl), for tests/cuda/test_nccl.py.

  python nccl_rank.py UID_HEX NRANKS RANK [die|mismatch]

Prints one JSON line: every collective's result (all-reduce eager, in place and chunked; all-gather;
an all-reduce captured into a graph and replayed on new data). With `die`, rank 1 exits after
joining and the others report how their all-reduce ended and how long it took; with `mismatch`,
rank 0 all-reduces more elements than the others and every rank reports how that ended.
"""

import json
import os
import struct
import sys
import time

from medusa.cuda import load_backend
from medusa.cuda.errors import CudaError
from medusa.cuda.nccl import Nccl

uid, n, rank = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else ""
b = load_backend("sim")
comm = Nccl(b).init_rank(n, uid, rank)
COUNT = 3000  # 12 KB of float32: three chunks with MEDUSA_NCCL_SLOT_BYTES=4096


def put(values, fmt="f"):
    data = struct.pack(f"{len(values)}{fmt}", *values)
    p = b.malloc(len(data))
    b.memcpy_htod(p, data)
    return p


def get(p, count, fmt="f"):
    return list(struct.unpack(f"{count}{fmt}", b.memcpy_dtoh(p, 4 * count)))


x = put([float(rank * 1000 + i) for i in range(COUNT)])
stream = b.stream_create()
if mode in ("die", "mismatch"):
    if mode == "die" and rank == 1:
        os._exit(0)
    t0 = time.monotonic()
    try:
        comm.all_reduce(x, x, COUNT if rank == 0 or mode == "die" else 1000, stream=stream)
        b.stream_synchronize(stream)
        out = {"error": None}
    except CudaError as e:
        out = {"error": str(e)}
    out["seconds"] = time.monotonic() - t0
    out["async_error"] = comm.async_error()
    print(json.dumps(out))
    sys.exit(0)

out = {}
y = b.malloc(4 * COUNT)
comm.all_reduce(x, y, COUNT, stream=stream)
b.stream_synchronize(stream)
out["all_reduce"] = get(y, COUNT)
comm.all_reduce(x, x, COUNT, op="max", stream=stream)  # in place
b.stream_synchronize(stream)
out["max_in_place"] = get(x, COUNT)[:3]
g_in = put([rank * 10 + k for k in range(5)], "i")
g_out = b.malloc(4 * 5 * n)
comm.all_gather(g_in, g_out, 5, dtype="int32", stream=stream)
b.stream_synchronize(stream)
out["all_gather"] = get(g_out, 5 * n, "i")
# captured: the graph holds the collective; each replay reduces what the inputs hold then
src, dst = put([float(rank + 1)] * 8), b.malloc(32)
b.begin_capture(stream)
comm.all_reduce(src, dst, 8, stream=stream)
graph = b.graph_instantiate(b.end_capture(stream))
replays = []
for scale in (1, 3):
    b.memcpy_htod(src, struct.pack("8f", *[float((rank + 1) * scale)] * 8))
    b.graph_launch(graph, stream)
    b.stream_synchronize(stream)
    replays.append(get(dst, 8)[0])
out["graph_replays"] = replays
comm.destroy()
print(json.dumps(out))
