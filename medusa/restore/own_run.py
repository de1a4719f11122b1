"""What a restore reads of its own process's recording (the recorder in restore mode writes it),
and the plan's allocations found in it: each one of a phase this start-up ran, by (phase,
ordinal), checked against its recorded size and kind."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from medusa import env
from medusa.restore.errors import RestoreError
from medusa.trace import Trace, TraceError, read_trace
from medusa.trace import control as trace
from medusa.trace.memory import Memory, memory, phase_names


@dataclass(frozen=True)
class OwnRun:
    trace: Trace  # the whole recording: kernels are found through every image the process loaded
    memory: Memory  # what it allocated since the restore's `since`
    entered: set[str]  # the phases it has begun, since the process started
    # NOTE: a recorded phase it has not begun is still to come (under vLLM the restore runs inside
    # capture_model, before the phases after it): its allocations cannot be checked yet, and no
    # graph points into them (a graph holds only what was allocated before its capture).


def read_own(since: int) -> OwnRun:
    """This process's recording; its memory since the trace sequence number SINCE."""
    path = env.TRACE.get()
    if not trace.active() or not path:
        raise RestoreError(
            "restore needs the recorder in restore mode (MEDUSA_TRACE, "
            "MEDUSA_MODE=restore, LD_PRELOAD): `medusa run --artifact` sets it; for "
            "another program, start it with `medusa trace record --mode restore -o "
            "restore-%p.mtr -- COMMAND`"
        )
    trace.flush()
    full = read_trace(path.replace("%p", str(os.getpid())), allow_truncated=True)
    later = full
    if since:  # NOTE: sequence numbers rise through the file (read_trace checks)
        first = int(np.searchsorted(full.records["seq"], since, side="right"))
        later = dataclasses.replace(full, records=full.records[first:])
    if later.stopped:
        raise TraceError(f"{later.path}: the recorder stopped early: {later.stopped}")
    mem = memory(later)
    return OwnRun(full, mem, set(phase_names(full) if since else mem.phases))


def map_allocations(
    plan_allocs: list[list[Any]],
    own: OwnRun,
    phases: set[str],
    sizes: dict[tuple[str, int], int],
    any_size: set[int],
) -> np.ndarray:
    """Where each plan allocation of PHASES (entered, not skipped) lives in this process (0 for
    the others). Each must match its recorded size (or `sizes`, for allocations this start-up
    sizes otherwise; those of `any_size` may have any size, which is put into `sizes`) and kind,
    and each such phase must have made as many allocations as recorded."""
    m = own.memory
    mine = m.index
    addrs = [0] * len(plan_allocs)
    n_plan: dict[str, int] = {}
    for i, (phase, ordinal, kind, size, _freed) in enumerate(plan_allocs):
        if phase not in phases:
            continue
        n_plan[phase] = n_plan.get(phase, 0) + 1
        key = (phase, ordinal)
        k = mine.get(key)
        if k is None:
            raise RestoreError(
                f"allocation #{i} (phase {phase!r} #{ordinal}, {size} bytes) was "
                "not made in this start-up: it diverges from the recorded one"
            )
        if any_size and i in any_size:
            sizes[key] = m.size[k]  # sized by this start-up's count
        if m.size[k] != (sizes.get(key, size) if sizes else size) or m.kind[k] != kind:
            raise RestoreError(
                f"allocation #{i} (phase {phase!r} #{ordinal}) is {m.size[k]} bytes "
                f"here, {size} bytes in the artifact: the start-up diverges"
            )
        addrs[i] = m.addr[k]
    for phase, n in n_plan.items():  # each phase that this start-up ran made as many as then
        if m.count.get(phase, 0) not in (0, n):
            raise RestoreError(
                f"phase {phase!r} made {m.count[phase]} allocations here, {n} when "
                "recorded: the start-up diverges"
            )
    return np.array(addrs, np.uint64)
