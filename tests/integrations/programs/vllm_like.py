"""A program shaped like a vLLM start-up, on simcuda: persistent inputs made before the capture,
a KV cache laid out as vLLM's FlashAttention one (all key blocks, then all value blocks: the value
cache's address depends on the block count), a graph pool, a hidden-states buffer and a native
scratch buffer (a cuBLAS workspace's stand-in) made during the capture, one "FULL" and one
"PIECEWISE" graph, and the plugin's sidecar (graphs under descriptor keys, output tensors at raw
addresses, the KV block count).

  python vllm_like.py record SIDECAR [BLOCKS]  capture, write the sidecar, replay; print the outputs
  python vllm_like.py restore DIR [BLOCKS]     restore from artifact DIR with a KV cache of BLOCKS
                                               (default 8); find the outputs the way the plugin's
                                               restore does (allocation + offset); same output
  python vllm_like.py record SIDECAR helper-first
                                       first run a helper process that touches the device (as
                                       vLLM's helpers may) before this one does
"""

import json
import struct
import subprocess
import sys

BLOCKS = int(sys.argv[3]) if sys.argv[3:] and sys.argv[3].isdigit() else 8
if sys.argv[3:] == ["helper-first"]:
    helper = "from medusa.cuda import load_backend; load_backend('sim').malloc(4096)"
    subprocess.run([sys.executable, "-c", helper], check=True)

from medusa import trace
from medusa.cuda import load_backend
from medusa.integrations.vllm.capture import tensor_spec

N = 256
b = load_backend("sim")
b.load_kernels("simcuda_testkernels")


class DevTensor:
    """Enough of a torch.Tensor for tensor_spec: float32, contiguous, on the device."""

    dtype = "torch.float32"

    def __init__(self, addr, n):
        self.addr, self.shape = addr, (n,)

    def data_ptr(self):
        return self.addr

    def stride(self):
        return (1,)

    def element_size(self):
        return 4


def total(addr, n):
    return sum(struct.unpack(f"{n}f", b.memcpy_dtoh(addr, 4 * n)))


def key(cls, **fields):
    return {"type": cls, "fields": fields}


FULL = key("BatchExecutionDescriptor", cg_mode={"enum": "CUDAGraphMode", "name": "FULL"},
           num_tokens=N, num_reqs=N)  # fmt: skip
PIECE = key("BatchDescriptor", num_tokens=N // 2, num_reqs=None)

trace.mark("load_model")
inp = b.malloc(4 * N)
b.memcpy_htod(inp, struct.pack(f"{N}f", *[float(i) for i in range(N)]))
stream = b.stream_create()
trace.mark("kv_alloc")
PAGE = 4 * N  # one block of keys (or values): N floats
kv = b.malloc(2 * BLOCKS * PAGE)
key, value = kv, kv + BLOCKS * PAGE  # like kv_cache.unbind(0) of a (2, blocks, ...) tensor
b.memcpy_htod(key, struct.pack(f"{N}f", *[float(i) for i in range(N)]))
b.memcpy_htod(value, struct.pack(f"{N}f", *[float(2 * i) for i in range(N)]))

if sys.argv[1] == "record":
    trace.mark("graph_capture")
    pool = b.malloc(8 * N)
    hidden = b.malloc(4 * N)
    # like PyTorch's cuBLAS workspace for the capture stream: made at the first GEMM on that
    # stream, held by native code only, scratch that both graphs write before they read it
    ws = b.malloc(4 * N)
    graphs = []
    for k, n in enumerate((N, N // 2)):
        piece = pool + 4 * N * k
        b.begin_capture(stream)
        b.launch("vector_add", 1, 32, [ws, key, inp, n], stream=stream)  # 2x
        b.launch("vector_add", 1, 32, [piece, ws, inp, n], stream=stream)  # 3x
        b.launch("vector_add", 1, 32, [hidden, piece, value, n], stream=stream)  # 5x
        graphs.append(b.graph_instantiate(b.end_capture(stream)))
    trace.mark("ready")
    side = {
        "graphs": [
            {"kind": "full", "key": FULL, "graph": 0},
            {
                "kind": "piecewise",
                "wrapper": 0,
                "key": PIECE,
                "graph": 1,
                "output": tensor_spec(DevTensor(pool + 4 * N, N // 2)),
            },  # fmt: skip
        ],
        "outputs": {
            "hidden_states": tensor_spec(DevTensor(hidden, N)),
            "aux_hidden_states": tensor_spec([]),
            "intermediate_tensors": tensor_spec(None),
        },
        "wrappers": [{"index": 0, "of": 1, "last": True}],
        "captures": 2,
        "kv_blocks": BLOCKS,
        "capture_live": [
            [hidden, 4 * N, "python"],  # held by the manager, like mgr.hidden_states
            [ws, 4 * N, "native"],
        ],
    }
    with open(sys.argv[2], "w") as f:
        json.dump(side, f)
    outputs = {"hidden_states": hidden, "piece": pool + 4 * N}
else:
    from medusa.artifact import load_artifact
    from medusa.restore import Restorer

    art = load_artifact(sys.argv[2])
    trace.mark("graph_capture")
    r = Restorer(art, b, count=BLOCKS)
    execs = r.restore(stream).execs
    section = art.manifest["vllm"]
    graphs = [execs[g["graph"]] for g in section["graphs"]]
    at = lambda spec: int(r.bases[0][spec["alloc"]]) + spec["offset"]  # noqa: E731
    outputs = {
        "hidden_states": at(section["outputs"]["hidden_states"]),
        "piece": at(section["graphs"][1]["output"]),
    }

for g, n in zip(graphs, (N, N // 2), strict=True):
    b.memset(outputs["hidden_states"], 0, 4 * N)
    b.graph_launch(g, stream)
    b.stream_synchronize(stream)
    print(f"n={n} hidden {total(outputs['hidden_states'], N):.1f}", end=" ")
print(f"piece {total(outputs['piece'], N // 2):.1f}")
