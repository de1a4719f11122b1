"""Slices as Ray custom resources: a node that has N slices of class C advertises
`medusa_slice_C: N`; a worker actor asks for one. A class name says what binds a worker to it:
a GH200 MIG profile (`1g.24gb`), a simulated slice (`8gb.132sm`), or an NVML MIG name.

Print a node's resources for `ray start --resources` with
    python -m medusa.serve.gateway.backends.resources [--slices slices.yaml]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter

from medusa.serve.gateway.slices import GH200_PROFILES, Slice, discover_slices

PREFIX = "medusa_slice_"
_SIM = re.compile(r"(?P<gb>[0-9.]+)gb\.(?P<sms>[0-9]+)sm")
_GB = re.compile(r"(?P<gb>[0-9.]+)gb")


def resource_name(kind: str) -> str:
    return PREFIX + kind


def node_resources(slices: list[Slice]) -> dict[str, float]:
    """What a node with `slices` advertises: `{"medusa_slice_<class>": count}`."""
    return {resource_name(k): float(n) for k, n in Counter(s.kind for s in slices).items()}


def cluster_slices(nodes: list[dict[str, object]]) -> list[tuple[str, str, int]]:
    """(node id, slice class, count) for every live node of `ray.nodes()` that has slices."""
    out = []
    for n in nodes:
        if not n.get("Alive"):
            continue
        res = n.get("Resources") or {}
        assert isinstance(res, dict)
        for name, count in sorted(res.items()):
            if name.startswith(PREFIX) and count >= 1:
                out.append((str(n["NodeID"]), name[len(PREFIX) :], int(count)))
    return out


def class_slice(kind: str, slice_id: str) -> Slice:
    """The slice a class names, as the gateway plans with it (memory, SMs). Its `env` binds a
    simulated slice; on a GPU node the node's actor finds the MIG instance with NVML."""
    sim = _SIM.fullmatch(kind)
    gb: float
    sms: int
    if kind in GH200_PROFILES:
        gb, sms = GH200_PROFILES[kind]
    elif kind == "sim":  # discover_slices' default slices of a machine without a slices file
        gb, sms = 8, 132
    elif sim:
        gb, sms = float(sim["gb"]), int(sim["sms"])
    elif m := _GB.search(kind):
        gb, sms = float(m["gb"]), 0
    else:
        raise ValueError(
            f"slice class {kind!r} (resource {resource_name(kind)}): expected a MIG profile such "
            "as 1g.24gb or a simulated class such as 8gb.132sm"
        )
    env = {
        "MEDUSA_DEVICE": "sim",
        "MEDUSA_SIM_MEMORY": f"{gb:g}G",
        "MEDUSA_SIM_SMS": str(sms or 132),
    }
    return Slice(slice_id, int(gb * 2**30), sms, env, kind=kind)


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m medusa.serve.gateway.backends.resources",
        description=__doc__.split("\n\n")[0],
    )
    ap.add_argument("--slices", help="this node's slices file (default: NVML's MIG instances)")
    args = ap.parse_args()
    print(json.dumps(node_resources(discover_slices(args.slices))))


if __name__ == "__main__":
    main()
