"""A plan recorded at one count (the KV cache's blocks) restored at another: the relocations whose
offset follows the count (plan["scale"], found by materialize.analysis.Scale from two recordings
at different counts) moved by slope x the difference, in a copy of the plan. The copy is checked
again against this start-up's allocation sizes before anything is built (Restorer)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from medusa.artifact.layout import RELOC
from medusa.restore.errors import RestoreError


def scaled_plan(plan: dict[str, Any], count: int) -> dict[str, Any]:
    """PLAN for COUNT: itself when it has no scale or was recorded at COUNT, else a copy whose
    count-following relocations point where they do at COUNT."""
    sc = plan.get("scale")
    if sc is None or count == sc["count"]:
        return plan
    if count <= 0:
        raise RestoreError(f"a count of {count} for the {sc['phase']!r} allocations")
    out = dict(plan)
    tables = [copy.copy(plan["templates"]), copy.copy(plan["graphs"])]
    out["templates"], out["graphs"] = tables
    arrays: dict[tuple[int, int], np.ndarray] = {}
    for table, i, row, slope in sc["relocs"]:
        key = (table, i)
        if key not in arrays:
            arrays[key] = np.frombuffer(tables[table][i]["relocs"], RELOC).copy()
        addend = int(arrays[key]["addend"][row]) + slope * (count - sc["count"])
        if not 0 <= addend < 1 << 63:
            raise RestoreError(
                f"at {count} {sc['phase']!r} blocks a relocation of the restored graphs points "
                "outside its allocation: the KV cache is too small for them"
            )
        arrays[key]["addend"][row] = addend
    for (table, i), rel in arrays.items():
        tables[table][i] = {**tables[table][i], "relocs": rel.tobytes()}
    return out


def scaled_allocs(plan: dict[str, Any]) -> set[int]:
    """The allocations whose size follows the count (none without plan["scale"])."""
    sc = plan.get("scale")
    return set(sc["allocs"]) if sc else set()
