"""The weight store step of `medusa materialize`: the engine's weights, as the loader hands them
to the device (dequantized, fused, float32), written before the recordings so that the recorded
start-ups load from it and allocate as a restored start will."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medusa.engine.loader import open_model
from medusa.engine.loader.stored import model_record
from medusa.weights import write_store

STORE = "weights.store"


def write_weights(model: str | None, out: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    """Writes MODEL's weight store to `out`; returns the manifest's `weights` section."""
    t0 = time.perf_counter()
    src = open_model(model)
    shapes = list(src.spec.weight_shapes().items())
    marks = iter((0.25, 0.5, 0.75, 2.0))
    mark = next(marks)

    def progress(done: int, total: int) -> None:
        nonlocal mark
        if done >= mark * total:
            took = time.perf_counter() - t0
            echo(f"  {done / 2**20:.0f} of {total / 2**20:.0f} MiB ({took:.1f} s)")
            mark = next(marks)

    info = write_store(out, shapes, src.weights(), model_record(src), progress=progress)
    echo(
        f"  {info['tensors']} tensors, {info['data_bytes'] / 2**20:.0f} MiB in {info['chunks']} "
        f"chunks of {info['chunk_size'] >> 20} MiB ({info['hash']}) in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    return {"file": STORE, **info}
