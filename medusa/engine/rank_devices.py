"""Each rank of a tensor-parallel group on a device of its own: the environment of each rank's
process, given the group's (medusa.serve.tensor_parallel starts ranks 1..N-1 with it, and
`medusa materialize --tensor-parallel-size N` all N).

On a GPU, the group's devices are the entries of CUDA_VISIBLE_DEVICES (GPU indices, GPU UUIDs or
MIG UUIDs: what the gateway gives a worker that holds N slices), and rank r sees entry r alone.
Unset, every GPU is visible and rank r gets index r. Fewer devices than ranks is refused: two
ranks on one device would share it (NCCL refuses that since 2.5).

On simcuda each rank's device is its own process's; MEDUSA_SIM_DEVICE_INDEX=r gives it board r's
identity (UUID, PCI bus id), and a CUDA_VISIBLE_DEVICES listing a device per rank is split the
same way (simcuda ignores it).

Rank 0 of `medusa run` is the process that starts the others, and it changes nothing in its own
environment: its CUDA driver is initialised by then (the back-end's probe calls cuInit before
the group exists), and CUDA reads CUDA_VISIBLE_DEVICES once, at cuInit, so a change would
silently do nothing. It needs none: CUDA numbers the visible devices in the order the variable
lists them, and the engine uses device ordinal 0 and never selects another, so rank 0 runs on
entry 0 however early its runtime started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from medusa.env import SIM_DEVICE_INDEX
from medusa.errors import RefusedError

VISIBLE = "CUDA_VISIBLE_DEVICES"


class RankDeviceError(RefusedError, ValueError):
    """The group's devices cannot give each rank one of its own."""


def rank_envs(
    size: int, kind: str, environ: Mapping[str, str], device_count: Callable[[], int]
) -> list[dict[str, str]]:
    """What rank r's process adds to the group's environment, for r in 0..size-1. kind: the
    back-end ("cuda" or "sim"); device_count: the devices CUDA shows this process (called only
    when the variable is unset on a GPU)."""
    envs = [{SIM_DEVICE_INDEX.name: str(r)} for r in range(size)]
    listed = environ.get(VISIBLE)
    if kind != "cuda":
        entries = _entries(listed) if listed else []
        if len(entries) >= size and len(set(entries)) == len(entries):
            for r, e in enumerate(envs):
                e[VISIBLE] = entries[r]
        return envs
    if listed is None:
        found = device_count()
        if found < size:
            raise RankDeviceError(
                f"a tensor-parallel group of {size} needs {size} GPUs, one per rank; CUDA shows "
                f"{found} ({VISIBLE} is unset): run on a machine with {size} GPUs, or with "
                "--tensor-parallel-size 1"
            )
        entries = [str(r) for r in range(size)]
    else:
        entries = _checked(listed, size)
    return [{**e, VISIBLE: entries[r]} for r, e in enumerate(envs)]


def _entries(listed: str) -> list[str]:
    return [e.strip() for e in listed.split(",")]


def _checked(listed: str, size: int) -> list[str]:
    """The variable's entries, refused unless it names `size` different devices."""
    entries = _entries(listed)
    where = f"{VISIBLE}={listed!r}"
    fix = (
        f"list one device per rank (e.g. {VISIBLE}=" + ",".join(map(str, range(size))) + ", or "
        "the GPU or MIG UUIDs `nvidia-smi -L` prints), or start with --tensor-parallel-size 1"
    )
    if "" in entries:
        raise RankDeviceError(f"{where} has an empty entry (CUDA stops reading there): {fix}")
    if len(entries) < size:
        raise RankDeviceError(
            f"{where} lists {len(entries)} device{'s' if len(entries) != 1 else ''} for a "
            f"tensor-parallel group of {size}: each rank needs a device of its own; {fix}"
        )
    twice = sorted({e for e in entries[:size] if entries[:size].count(e) > 1})
    if twice:
        raise RankDeviceError(
            f"{where} lists {', '.join(twice)} more than once: each rank needs a device of its "
            f"own; {fix}"
        )
    return entries[:size]
