"""Steps of `medusa materialize` (medusa.engine.materialize) that run once per rank of a
tensor-parallel group (once, for one device): writing a rank's weight store, and the plain
start-up that learns the KV size. The ranks of a group run at once (they meet in collectives),
each told its place through a private file."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from medusa.artifact.store import rank_store
from medusa.child import python_module
from medusa.engine.config import EngineConfig
from medusa.engine.loader import open_model
from medusa.engine.loader.stored import Shard, model_record, store_shapes
from medusa.materialize.analysis import MaterializeError
from medusa.materialize.driver import Echo, check_room, run_group
from medusa.weights import write_store

REPORT = "medusa.engine.startup_report"


def suffix(r: int, ranks: int) -> str:
    """A recording's file-name suffix: none on one device, .rR for rank R."""
    return "" if ranks == 1 else f".r{r}"


def rank_envs(ranks: int) -> list[dict[str, str]]:
    """Each rank's process on a device of its own (medusa.engine.rank_devices)."""
    from medusa.cuda import load_backend
    from medusa.engine.rank_devices import rank_envs as envs

    backend = load_backend()
    return envs(ranks, backend.kind, os.environ, backend.device_count)


def rank_files(work: Path, name: str, ranks: int) -> list[Path]:
    """Each rank's place in a new communicator (medusa.engine.startup_report's TP file), in
    the private work directory: its id is never on a command line."""
    from medusa.cuda import load_backend
    from medusa.cuda.nccl import Nccl

    uid = Nccl(load_backend()).unique_id().hex()
    files = [work / f"{name}.tp{r}.json" for r in range(ranks)]
    for r, f in enumerate(files):
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"rank": r, "size": ranks, "uid": uid}, out)
    return files


def write_weights(
    model: str | None, near: Path, echo: Echo, shard: Shard | None = None
) -> tuple[Path, dict[str, Any]]:
    """Writes MODEL's weight store beside the artifact (a rank's: its shard, and the shard named
    in its record): its weights as the loader hands them to the device (dequantized, fused,
    float32), so the recorded start-ups allocate as a restored start will. Returns the store's
    path and the manifest's `weights` section."""
    t0 = time.perf_counter()
    src = open_model(model)
    shapes = list(store_shapes(src.spec, shard).items())
    name = rank_store(shard[0] if shard else 0)
    weights: Any = src.weights()
    if shard is not None:
        from medusa.engine.tensor_parallel import plan_shard, shard_weights

        part = shard_weights(weights, src.spec, plan_shard(src.spec, *shard))
        weights = _in_order(part, [n for n, _ in shapes])
    marks = iter((0.25, 0.5, 0.75, 2.0))
    mark = next(marks)

    def progress(done: int, total: int) -> None:
        nonlocal mark
        if done >= mark * total:
            took = time.perf_counter() - t0
            echo(f"  {done / 2**20:.0f} of {total / 2**20:.0f} MiB ({took:.1f} s)")
            mark = next(marks)

    record = model_record(src, shard)
    info = write_store(near / name, shapes, weights, record, progress=progress)
    label = f"{name}: " if shard else ""
    echo(
        f"  {label}{info['tensors']} tensors, {info['data_bytes'] / 2**20:.0f} MiB in "
        f"{info['chunks']} chunks of {info['chunk_size'] >> 20} MiB ({info['hash']}) in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    return near / name, {"file": name, **info}


def _in_order(
    weights: Iterator[tuple[str, np.ndarray]], names: list[str]
) -> Iterator[tuple[str, np.ndarray]]:
    """WEIGHTS in the order of NAMES (a shard's head comes beside the embedding it is cut from;
    the store lists it last): held only until its turn."""
    held: dict[str, np.ndarray] = {}
    for name in names:
        while name not in held:
            got, arr = next(weights)
            held[got] = arr
        yield name, held.pop(name)


def probe_kv(
    config: EngineConfig, work: Path, stores: list[str], echo: Echo
) -> list[dict[str, Any]]:
    """The KV cache a plain start-up sizes, per rank (eager: the profiling pass is all it
    needs); STORES: each rank's weight store ("" for the model file)."""
    t0 = time.perf_counter()
    n = len(stores)
    cfg = json.dumps({**asdict(config), "enforce_eager": True})
    env = {k: v for k, v in os.environ.items() if k not in ("MEDUSA_TRACE", "MEDUSA_MODE")}
    outs = [work / f"probe{suffix(r, n)}.json" for r in range(n)]
    if n == 1:
        res = subprocess.run(python_module(REPORT, cfg, str(outs[0]), stores[0]), env=env,
                             capture_output=True, text=True)  # fmt: skip
        check_room(work)
        if res.returncode != 0:
            raise MaterializeError(
                f"the plain start-up exited {res.returncode}:\n{res.stderr[-3000:]}"
            )
    else:
        tp = rank_files(work, "probe", n)
        cmds = [python_module(REPORT, cfg, str(o), stores[r], str(tp[r]))
                for r, o in enumerate(outs)]  # fmt: skip
        envs = [{**env, **d} for d in rank_envs(n)]
        run_group(cmds, envs, [o.with_suffix(".log") for o in outs], "the plain start-up")
    kv = [json.loads(o.read_text())["kv"] for o in outs]
    echo(f"  {kv[0]['num_blocks']} KV blocks ({time.perf_counter() - t0:.1f} s)")
    return kv
