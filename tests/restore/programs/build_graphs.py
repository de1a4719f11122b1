"""Builds every graph of a list of (crafted) restore plans through the C graph builder, in a
process of its own so that a crash shows as a signal, not as a dead test runner.

  python build_graphs.py PLANS.msgpack [--no-validate]

PLANS holds a list of plans of the general program's artifact (its kernels are simcuda's test
kernels). Each allocation, module global and VMM reservation a plan declares gets a fresh device
allocation of its recorded size; saved contents are relocated (not written); graphs are built,
instantiated and uploaded (not launched), one call per graph, then all in one call
(mr_build_plan). Prints one JSON line per plan: its C return codes."""

from __future__ import annotations

import ctypes
import json
import sys

import msgpack
import numpy as np

from medusa.artifact import ArtifactError
from medusa.artifact.layout import ATTR, EDGE, NODE, RELOC, pack_funcs
from medusa.cuda import load_backend
from medusa.restore.builder import GraphBuilder
from medusa.restore.validate import validate_plan

b = load_backend("sim")
b.load_kernels("simcuda_testkernels")


def _func(name: str) -> int:
    fn = ctypes.c_void_p()
    b.call("cudaGetFuncBySymbol", ctypes.byref(fn), ctypes.c_void_p(b.symbol(name)))
    return int(fn.value or 0)


FUNCS = {n: _func(n) for n in ("vector_add", "axpy_struct", "gather_ptrs", "add_global_bias")}


def _bases(plan: dict) -> list[np.ndarray]:
    def table(sizes: list[int]) -> np.ndarray:
        return np.array([b.malloc(max(1, min(int(s), 1 << 20))) for s in sizes], np.uint64)

    allocs = table([a[3] for a in plan["allocs"]])
    n_glob = max((g["index"] for g in plan["globals"]), default=-1) + 1
    n_vmm = max((v["index"] for v in plan["vmm"]), default=-1) + 1
    return [allocs, allocs, table([64] * min(n_glob, 64)), table([1 << 20] * min(n_vmm, 64))]


def build(plan: dict) -> dict:
    bases = _bases(plan)
    builder = GraphBuilder(bases)
    handles = np.array([FUNCS.get(f["name"], 0) for f in plan["funcs"]], np.uint64)
    funcs, layout = pack_funcs(handles, plan["funcs"])
    out: dict = {"contents": [], "graphs": []}
    for c in plan["contents"].values():
        data = bytearray(c["data"])
        relocs = np.array([tuple(r) for r in c["relocs"]], RELOC)
        out["contents"].append(builder.relocate(data, relocs))
    for g in plan["graphs"]:
        t = plan["templates"][g["template"]]
        nodes = np.frombuffer(t["nodes"], NODE).copy()
        if g["idx"]:
            nodes[np.frombuffer(g["idx"], "<u4")] = np.frombuffer(g["rows"], NODE)
        params = np.frombuffer(t["params"] + g["params"] + b"\0", np.uint8)
        relocs = np.frombuffer(t["relocs"] + g["relocs"], RELOC)
        edges, attrs = np.frombuffer(t["edges"], EDGE), np.frombuffer(g["attrs"], ATTR)
        code, err, _ = builder.build(nodes, params, relocs, edges, attrs, funcs, layout, 0)
        out["graphs"].append([code, err])
    code, err, execs, _ = builder.build_plan(plan, funcs, layout, 0)
    out["plan_build"] = [code, err, len(execs)]  # all graphs in one call, as a restore does
    for a in bases[0]:
        b.free(int(a))
    return out


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        plans = msgpack.unpackb(f.read(), strict_map_key=False)
    for i, plan in enumerate(plans):
        if "--no-validate" not in sys.argv:
            try:
                validate_plan(plan, f"plan {i}")
            except ArtifactError as e:
                print(json.dumps({"plan": i, "refused": str(e)}), flush=True)
                continue
        print(json.dumps({"plan": i, "started": True}), flush=True)
        print(json.dumps({"plan": i, **build(plan)}), flush=True)


if __name__ == "__main__":
    main()
