"""Device slices a worker runs on: MIG instances or whole GPUs found with NVML, or, on a CPU
machine, simulated slices from a topology file, passed to simcuda as memory and SM limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from medusa import env

# GH200 MIG profiles (96 GB HBM3): memory and SMs of each, as examples for topology files.
GH200_PROFILES = {
    "1g.12gb": (12, 16),
    "1g.24gb": (24, 26),
    "2g.24gb": (24, 32),
    "3g.48gb": (48, 60),
    "4g.48gb": (48, 64),
    "7g.96gb": (96, 132),
}


@dataclass
class Slice:
    id: str
    memory: int  # bytes
    sms: int
    env: dict[str, str] = field(default_factory=dict)  # what binds a worker to this slice
    busy: bool = False  # a worker (serving, starting or pooled) runs on it
    kind: str = "sim"  # the slice class (MIG profile): the warm pool is sized per class
    shared: bool = False  # sharing: elastic: several models' workers share it (then `busy` is moot)
    members: tuple[Slice, ...] = ()  # a tensor-parallel worker's slices, one per rank (slice_group)

    @property
    def held(self) -> tuple[Slice, ...]:
        """The slices a worker placed here holds: this one, or a group's members."""
        return self.members or (self,)


def slice_group(members: list[Slice]) -> Slice:
    """Slices of one class as the one place a tensor-parallel worker runs, rank r on the r-th:
    the group's env lists their devices in order in CUDA_VISIBLE_DEVICES, which the worker's
    rank 0 splits (medusa.engine.rank_devices). Simulated slices need no list: each rank's
    simcuda device is its own process's, with the class's memory and SMs."""
    first = members[0]
    group_env = dict(first.env)
    devices = [s.env.get("CUDA_VISIBLE_DEVICES", "") for s in members]
    if all(devices):
        group_env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    name = "+".join(s.id for s in members)
    return Slice(name, first.memory, first.sms, group_env, True, first.kind, members=tuple(members))


def simulated_slices(topology: str | Path | list[Any]) -> list[Slice]:
    """topology: a file holding `slices: [{profile: 1g.12gb}, {name: s2, memory_gb: 8, sms:
    26}, ...]`, or that list itself (models.yaml's `slices:` inline)."""
    if isinstance(topology, list):
        listed, topology = topology, "slices"
    else:
        listed = (yaml.safe_load(Path(topology).read_text()) or {}).get("slices", [])
    out = []
    gb: Any
    sms: Any
    for i, s in enumerate(listed):
        if not isinstance(s, dict):
            raise ValueError(
                f"{topology}: slices[{i}]: expected a mapping such as {{profile: 1g.12gb}} or "
                f"{{memory_gb: 8, sms: 26}}, got {s!r}"
            )
        if "profile" in s:
            if s["profile"] not in GH200_PROFILES:
                raise ValueError(
                    f"{topology}: slices[{i}].profile {s['profile']!r}; known: "
                    f"{sorted(GH200_PROFILES)}"
                )
            gb, sms = GH200_PROFILES[s["profile"]]
            gb = s.get("memory_gb", gb)
        else:
            gb, sms = s.get("memory_gb"), s.get("sms", 132)
            if not isinstance(gb, int | float) or gb <= 0:
                raise ValueError(f"{topology}: slices[{i}]: give a profile or memory_gb")
        name = s.get("name", f"sim{i}")
        kind = s.get("profile") or f"{gb:g}gb.{sms}sm"
        env = {
            "MEDUSA_DEVICE": "sim",
            "MEDUSA_SIM_MEMORY": f"{gb}G",
            "MEDUSA_SIM_SMS": str(sms),
            "MEDUSA_SIM_DEVICE_NAME": s.get("device_name", "simcuda H100 80GB HBM3 (CPU)"),
        }
        out.append(Slice(name, int(gb * 2**30), int(sms), env, kind=kind))
    if not out:
        raise ValueError(f"{topology}: no slices listed")
    return out


def nvml_slices() -> list[Slice]:
    """MIG instances of MIG-enabled GPUs, and whole GPUs otherwise (NVML via nvidia-ml-py)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return [
            _nvml_slice(h)
            for i in range(pynvml.nvmlDeviceGetCount())
            for h in _nvml_handles(pynvml.nvmlDeviceGetHandleByIndex(i))
        ]
    finally:
        pynvml.nvmlShutdown()


def _nvml_handles(gpu: Any) -> list[Any]:
    """The GPU's MIG instances if MIG is on, else the GPU itself."""
    import pynvml

    try:
        mig, _ = pynvml.nvmlDeviceGetMigMode(gpu)
    except pynvml.NVMLError:
        mig = 0
    if not mig:
        return [gpu]
    handles = []
    for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, j))
        except pynvml.NVMLError:
            continue
    return handles


def _nvml_slice(h: Any) -> Slice:
    import pynvml

    uuid = pynvml.nvmlDeviceGetUUID(h)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
    try:
        sms = pynvml.nvmlDeviceGetAttributes(h).multiprocessorCount
    except pynvml.NVMLError:
        sms = 0
    name = pynvml.nvmlDeviceGetName(h)
    name = name.decode() if isinstance(name, bytes) else name
    return Slice(
        uuid,
        int(mem),
        int(sms),
        {"CUDA_VISIBLE_DEVICES": uuid, "MEDUSA_DEVICE": "cuda"},
        kind=name.rsplit(" MIG ", 1)[-1],  # "NVIDIA H100 ... MIG 1g.10gb"
    )


def discover_slices(topology: str | list[Any] | None) -> list[Slice]:
    if topology:
        return simulated_slices(topology)
    try:
        found = nvml_slices()
    except Exception:  # noqa: BLE001 - no NVML library or no driver: a CPU machine
        found = []
    if found:
        return found
    n = env.GATEWAY_SIM_SLICES.get()
    return [Slice(f"sim{i}", 8 << 30, 132, {"MEDUSA_DEVICE": "sim"}) for i in range(n)]
