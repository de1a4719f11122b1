"""The saved contents of a plan: the permanent buffers of skipped phases that a graph can reach,
with their pointer words relocated, bounded so that an artifact stays small enough to upload at
every restore."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from medusa.materialize.analysis import (
    AddressIndex,
    MaterializeError,
    Scale,
    Unmoved,
    relocate_contents,
)
from medusa.trace.run_view import DEVICE, HOST, NEVER, RunView

# NOTE: saved contents live in the artifact and are uploaded at every restore; a bigger buffer
# belongs to a phase the restore runs (the engine fills it), not in the artifact.
MAX_SAVED_BYTES = 64 << 20


def saved_contents(
    a: RunView,
    b: RunView,
    ia: AddressIndex,
    ib: AddressIndex,
    unmoved: Unmoved,
    roots: set[int],
    skipped: Callable[[str], bool],
    scale: Scale | None = None,
) -> dict[int, dict[str, Any]]:
    """The saved contents of every permanent buffer of a skipped phase that a graph can reach:
    named by a node, or reached from saved contents through a pointer word (a device-side
    pointer table), transitively."""
    contents: dict[int, dict[str, Any]] = {}
    todo, seen = sorted(roots), set(roots)
    while todo:
        i = todo.pop()
        al = a.allocs[i]
        if not skipped(al.phase):
            continue  # the engine makes (and fills) this one itself
        if al.free_seq != NEVER:
            raise MaterializeError(
                f"allocation #{i} ({al.size} bytes, phase {al.phase!r}) is used by a graph but "
                "freed during start-up: the graph would point at freed memory"
            )
        saved = _saved(a, b, ia, ib, unmoved, i, scale)
        if saved is None:
            continue
        contents[i] = saved
        for r in saved["relocs"]:
            if r[1] in (DEVICE, HOST) and r[2] not in seen:
                seen.add(r[2])
                todo.append(r[2])
    return dict(sorted(contents.items()))


def _saved(
    a: RunView,
    b: RunView,
    ia: AddressIndex,
    ib: AddressIndex,
    unmoved: Unmoved,
    i: int,
    scale: Scale | None,
) -> dict[str, Any] | None:
    """One buffer's contents with its pointer words relocated; None when nothing worth saving
    was recorded (every word is stale: start-up never wrote it, so no graph can depend on it)."""
    al, bl = a.allocs[i], b.allocs[i]
    if al.seq in a.unsaved or bl.seq in b.unsaved:
        raise MaterializeError(
            f"allocation #{i} ({al.size} bytes, phase {al.phase!r}) is reached by a graph but "
            "the recorder could not save its contents (too large to snapshot): make it in a "
            "phase the restore runs"
        )
    if al.seq not in a.contents or bl.seq not in b.contents:
        return None
    seq_a, data_a = a.contents[al.seq]
    seq_b, data_b = b.contents[bl.seq]
    where = f"allocation #{i}'s contents"
    finds = ia.at(seq_a), ib.at(seq_b)
    relocs, stale = relocate_contents(data_a, data_b, *finds, where, unmoved, scale)
    if not relocs and stale == len(data_a) // 8:
        return None
    if len(data_a) > MAX_SAVED_BYTES:
        raise MaterializeError(
            f"allocation #{i} ({al.size} bytes, phase {al.phase!r}) is reached by a graph and "
            f"its contents would be saved in the artifact, but saved contents are bounded at "
            f"{MAX_SAVED_BYTES >> 20} MiB per allocation: make (and fill) it in a phase the "
            "restore runs instead"
        )
    return {"data": data_a, "relocs": [list(r) for r in relocs]}
