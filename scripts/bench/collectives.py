"""The collective's cost per call on simcuda (libmedusa_nccl), at 2 and 4 ranks: an all-reduce of
one SmolLM2 hidden state per token (576 float32) and of a 64-token batch, launched eagerly and
replayed from a captured graph, beside the cost of a plain kernel launch on the same stream (the
floor every collective pays), all measured in one run. One process per rank, as a
tensor-parallel engine runs them. On a GPU the same calls go to the real NCCL.

Run: python scripts/bench/collectives.py [--ranks 2,4] [--calls 300]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from serverless import clean_env  # scripts/bench/, next to this file

SIZES = {"1 token (576 floats)": 576, "64 tokens (36,864 floats)": 576 * 64}


def rank_main(uid: str, n: int, rank: int, calls: int) -> None:
    """One rank: microseconds per call, eager and replayed, for each size; rank 0 prints them."""
    from medusa.cuda import load_backend
    from medusa.cuda.nccl import Nccl

    b = load_backend("sim")
    comm = Nccl(b).init_rank(n, bytes.fromhex(uid), rank)
    stream = b.stream_create()
    b.load_kernels("simcuda_testkernels")
    out = {label: _cases(b, stream, comm, count, calls) for label, count in SIZES.items()}
    comm.destroy()
    if rank == 0:
        print(json.dumps(out))


def _cases(b, stream, comm, count: int, calls: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Microseconds per call: the all-reduce eager, replayed from a graph, and a plain kernel."""
    buf = b.malloc(4 * count)
    b.memset(buf, 0, 4 * count)

    def eager() -> None:
        comm.all_reduce(buf, buf, count, stream=stream)

    def kernel() -> None:
        b.launch("vector_add", 1, 32, [buf, buf, buf, count], stream=stream)

    return {
        "eager": _time(b, stream, calls, eager),
        "graph": _time(b, stream, calls, _graph(b, stream, comm, buf, count)),
        "kernel": _time(b, stream, calls, kernel),
    }


def _graph(b, stream, comm, buf, count):  # type: ignore[no-untyped-def]
    b.begin_capture(stream)
    comm.all_reduce(buf, buf, count, stream=stream)
    g = b.graph_instantiate(b.end_capture(stream))
    return lambda: b.graph_launch(g, stream)


def _time(b, stream, calls: int, fn) -> float:  # type: ignore[no-untyped-def]
    for _ in range(10):  # warm: the module registered, the pages touched
        fn()
    b.stream_synchronize(stream)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    b.stream_synchronize(stream)
    return (time.perf_counter() - t0) / calls * 1e6


def run(n: int, calls: int) -> dict[str, dict[str, float]]:
    from medusa.cuda import load_backend
    from medusa.cuda.nccl import Nccl

    uid = Nccl(load_backend("sim")).unique_id().hex()
    cmd = [sys.executable, __file__, "--calls", str(calls), "--rank-of", uid, str(n)]
    procs = [subprocess.Popen([*cmd, str(r)], env=clean_env(), stdout=subprocess.PIPE, text=True)
             for r in range(n)]  # fmt: skip
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"a rank failed: {[p.returncode for p in procs]}")
    return json.loads(outs[0])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4", help="rank counts, comma-separated (default 2,4)")
    ap.add_argument("--calls", type=int, default=300, help="calls timed per case (default 300)")
    ap.add_argument("--rank-of", nargs=3, metavar=("UID", "N", "RANK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_of:
        uid, n, rank = args.rank_of
        rank_main(uid, int(n), int(rank), args.calls)
        return
    print(f"{'ranks':>5}  {'size':<28}{'eager µs':>10}{'graph µs':>10}{'kernel µs':>10}"
          f"{'eager/kernel':>14}")  # fmt: skip
    for n in map(int, args.ranks.split(",")):
        for label, t in run(n, args.calls).items():
            print(f"{n:>5}  {label:<28}{t['eager']:>10.1f}{t['graph']:>10.1f}{t['kernel']:>10.1f}"
                  f"{t['eager'] / t['kernel']:>13.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
