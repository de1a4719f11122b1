"""Joining what the plugin saw in two recorded vLLM start-ups (graphs under descriptors, output
tensors at raw addresses) with the traces: graph keys point at plan graphs, and every output
tensor becomes (allocation, offset), the same in both runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from medusa.artifact.layout import RELOC
from medusa.integrations.vllm.capture import spec_tensors
from medusa.materialize.analysis import AddressIndex, MaterializeError
from medusa.trace.run_view import DEVICE, NEVER, RunView

AT_END = int(NEVER) - 1  # "live when the start-up finished"


def _relocate_spec(
    spec_a: dict[str, Any],
    spec_b: dict[str, Any],
    ia: AddressIndex,
    ib: AddressIndex,
    where: str,
    phases: list[str],
    skipped: Callable[[str], bool],
) -> dict[str, Any]:
    """spec_a with each tensor as (allocation, offset), checked alike in run b; phases[i] is
    allocation i's phase, and outputs must lie in a skipped (replayed) phase's memory."""
    ta, tb = spec_tensors(spec_a), spec_tensors(spec_b)
    if _layout(spec_a) != _layout(spec_b):
        raise MaterializeError(f"{where}: the runs' output tensors differ in type or shape")
    out = _strip(spec_a)
    for leaf, xa, xb in zip(spec_tensors(out), ta, tb, strict=True):
        fa, fb = ia.find(xa["addr"], AT_END), ib.find(xb["addr"], AT_END)
        if fa is None or fb is None:
            raise MaterializeError(
                f"{where}: an output tensor at {xa['addr']:#x} lies in no live allocation"
            )
        if fa != fb or fa[0] != DEVICE:
            raise MaterializeError(
                f"{where}: an output tensor is allocation #{fa[1]}+{fa[2]} in one run and "
                f"#{fb[1]}+{fb[2]} in the other"
            )
        if not skipped(phases[fa[1]]):
            # In a restored process that memory belongs to torch's allocator, which would hand
            # it out again while the graphs write there.
            raise MaterializeError(
                f"{where}: an output tensor lies in allocation #{fa[1]} (phase "
                f"{phases[fa[1]]!r}), made before the graph capture: torch's allocator carved "
                "it from an older segment, which a restore cannot reserve; this start-up cannot "
                "be materialized as is"
            )
        leaf["alloc"], leaf["offset"] = fa[1], fa[2]
    return out


def _layout(spec: dict[str, Any]) -> tuple[str, list[Any]]:
    return spec["t"], [(x["dtype"], x["shape"], x["stride"]) for x in spec_tensors(spec)]


def _ident(g: dict[str, Any]) -> tuple[Any, ...]:
    return g["kind"], g["key"], g.get("wrapper"), g["graph"]


def _strip(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of spec without run-specific addresses."""
    if spec["t"] == "tensor":
        return {k: v for k, v in spec.items() if k != "addr"}
    if spec["t"] == "intermediate":
        return {"t": spec["t"], "items": {k: _strip(v) for k, v in spec["items"].items()}}
    if "items" in spec:
        return {"t": spec["t"], "items": [_strip(v) for v in spec["items"]]}
    return dict(spec)


def _plan_relocs(plan: dict[str, Any]) -> np.ndarray:
    parts = [np.frombuffer(t["relocs"], RELOC) for t in plan["templates"]]
    parts += [np.frombuffer(g["relocs"], RELOC) for g in plan["graphs"]]
    out = np.concatenate(parts) if parts else np.zeros(0, RELOC)
    return out[out["kind"] == DEVICE]


def _check_capture_live(
    blocks: list[list[Any]],
    ia: AddressIndex,
    plan: dict[str, Any],
    outputs: list[dict[str, Any]],
    phases: list[str],
    skipped: Callable[[str], bool],
) -> None:
    """Blocks torch handed out during the capture and still live, each [address, size, owner].

    A block no graph uses is fine, and so is an output the restore rebuilds. A block only native
    code holds (owner "native": PyTorch's cuBLAS/cuBLASLt workspace for the capture stream, see
    recording.python_held) is replayed with its capture-phase allocation, so graphs may use it as
    long as it lies in such an allocation. A block a Python object holds (owner "python"; a
    sidecar without owners counts as that) would be made anew by its owner in a restored
    process while the graphs kept using the old memory: refused."""
    relocs = _plan_relocs(plan)
    for block in blocks:
        addr, size = int(block[0]), int(block[1])
        owner = block[2] if len(block) > 2 else "python"
        f = ia.find(addr, AT_END)
        if f is None or f[0] != DEVICE:
            continue
        _, alloc, off = f
        used = (relocs["target"] == alloc) & (relocs["addend"] >= off)
        used &= relocs["addend"] < off + size
        if not used.any():
            continue
        if any(
            o["alloc"] == alloc and o["offset"] < off + size and off < o["offset"] + o["bytes"]
            for o in outputs
        ):
            continue
        if owner == "native":
            if skipped(phases[alloc]):
                continue
            raise MaterializeError(
                f"the graphs use a {size}-byte native buffer (such as a cuBLAS workspace) made "
                f"during the capture in allocation #{alloc} (phase {phases[alloc]!r}), which is "
                "older than the capture: torch's allocator carved it from a segment a restore "
                "cannot reserve; this start-up cannot be materialized as is"
            )
        raise MaterializeError(
            f"the graphs use a {size}-byte buffer vLLM created during the capture (allocation "
            f"#{alloc}+{off}) that is not an output the restore rebuilds; in a restored process "
            "its owner would make another, so this start-up cannot be materialized as is"
        )


def graph_section(
    a: RunView,
    b: RunView,
    side_a: dict[str, Any],
    side_b: dict[str, Any],
    skipped: Callable[[str], bool],
    plan: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The graphs, their outputs and the wrappers of the artifact's vLLM section. Output tensors
    must lie in memory the skipped (capture) phase allocated, which a restore replays; with the
    plan, buffers created during the capture that graphs use must be such outputs."""
    n = len(a.graphs)
    for side, name in ((side_a, "first"), (side_b, "second")):
        if side.get("captures") != n:
            raise MaterializeError(
                f"the {name} run's trace holds {n} captured graphs, vLLM captured "
                f"{side.get('captures')}: something captured outside torch.cuda.CUDAGraph"
            )
    if [_ident(g) for g in side_a["graphs"]] != [_ident(g) for g in side_b["graphs"]]:
        raise MaterializeError("the two runs captured different graphs under vLLM's descriptors")
    if side_a["wrappers"] != side_b["wrappers"]:
        raise MaterializeError("the two runs built different piecewise graph wrappers")
    ia, ib = AddressIndex(a), AddressIndex(b)
    phases = [x.phase for x in a.allocs]
    graphs = []
    for ga, gb in zip(side_a["graphs"], side_b["graphs"], strict=True):
        g = {k: v for k, v in ga.items() if k != "output"}
        if "output" in ga:
            where = f"piecewise graph {ga['graph']} (wrapper {ga['wrapper']})"
            g["output"] = _relocate_spec(ga["output"], gb["output"], ia, ib, where, phases, skipped)
        graphs.append(g)
    outputs = {
        k: _relocate_spec(v, side_b["outputs"][k], ia, ib, f"the FULL graphs' {k}", phases, skipped)
        for k, v in side_a["outputs"].items()
    }
    if plan is not None:
        leaves = [x for g in graphs if "output" in g for x in spec_tensors(g["output"])]
        leaves += [x for v in outputs.values() for x in spec_tensors(v)]
        _check_capture_live(side_a.get("capture_live", []), ia, plan, leaves, phases, skipped)
    return {"graphs": graphs, "outputs": outputs, "wrappers": side_a["wrappers"]}
