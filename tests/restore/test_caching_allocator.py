"""The GPU check torch_restore.sh, run here on its simcuda twin: a program that owns device memory
as PyTorch does (segments carved into blocks, a graph pool shared by captures whose blocks one
graph frees and the next takes, a workspace per stream, kernels of hidden modules) is recorded,
materialized and restored in a fresh process by the very check.py and harness.py the GPU check
runs, and its restored graphs give the recorded outputs bit for bit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from medusa.artifact import load_artifact
from medusa.artifact.layout import NODE, RELOC
from medusa.trace import NodeType
from tests.processes import clean_env

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAMS = Path(__file__).parent / "programs"
TORCH_RESTORE = Path(__file__).parents[2] / "scripts" / "gpu" / "torch_restore"


def _check(lib: Path, work: Path) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env["MEDUSA_SIM_MEMCHECK"] = "1"  # a relocated pointer outside its allocation fails a launch
    cmd = [
        sys.executable,
        str(TORCH_RESTORE / "check.py"),
        "--work",
        str(work),
        "--limits",
        "60,120,60",
        "--",
        sys.executable,
        str(PROGRAMS / "caching_allocator.py"),
        str(lib),
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def checked(cprog, tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    lib = cprog(
        "caching_allocator_model",
        src_dir=PROGRAMS,
        libs=("simcuda", "m"),
        shared=True,
        sources=(PROGRAMS / "caching_allocator.c",),
    )
    work = tmp_path_factory.mktemp("torch-twin")
    return _check(lib, work), work, lib


def test_the_twin_restores_every_graph_bit_exact(checked):
    res, _, _ = checked
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[-2] == "caching-allocator restore: bit-identical 3/3 graphs"
    assert re.fullmatch(r"capture vs restore per 1000 nodes: [\d.]+ ms vs [\d.]+ ms", lines[-1])
    for batch in (4, 2, 1):
        assert f"(batch {batch}): bit-identical to its capture in 3 runs" in res.stdout
    assert "kernels found by {'loaded image': 7}" in res.stdout  # none exported, all resolved


def test_the_artifact_holds_what_a_caching_allocator_makes(checked):
    """What the restore had to get right, read from the artifact: pointers into the middle of
    segments, a saved pointer table, memset and memcpy nodes, each graph only its own nodes."""
    _, work, _ = checked
    plan = load_artifact(work / "art").plan
    allocs = plan["allocs"]
    pool = [i for i, a in enumerate(allocs) if a[0] == "graph_capture"]
    assert [allocs[i][3] for i in pool] == [2 << 20]  # one 2 MiB segment for every graph
    assert plan["replay"] == [["a", pool[0]]]
    assert allocs[0][:2] == ["setup", 0] and allocs[0][3:] == [12 << 20, True]  # given back
    (t,) = plan["templates"]  # every graph has the same kernels: one template
    nodes, relocs = np.frombuffer(t["nodes"], NODE), np.frombuffer(t["relocs"], RELOC)
    # NOTE: torch destroys each graph once instantiated, so the next capture may get its handle
    # (here it does): a graph mixed with another's nodes would hold three times as many.
    assert len(nodes) * len(plan["graphs"]) == plan["num_nodes"] == 123
    assert sorted(set(nodes["type"])) == [NodeType.KERNEL, NodeType.MEMCPY, NodeType.MEMSET]
    large = [i for i, a in enumerate(allocs) if a[3] == 20 << 20]  # the MLP weights' segment
    offsets = {int(r["addend"]) for r in relocs if r["target"] in large}
    assert offsets == {k * (3 << 19) for k in range(4)}  # four 1.5 MiB weights, carved
    (table,) = plan["contents"].values()  # the KV-pointer table, inside the pool segment
    assert [r[:2] for r in table["relocs"]] == [[8 * i, 0] for i in range(4)]
    assert len({r[2] for r in table["relocs"]}) == 1 and min(r[3] for r in table["relocs"]) > 0


def test_an_output_that_differs_fails_the_restore(checked, tmp_path):
    _, work, lib = checked
    ref = tmp_path / "ref"
    ref.mkdir()
    for f in (work / "ref").iterdir():
        (ref / f.name).write_bytes(f.read_bytes())
    victim = sorted(ref.glob("run-*.npz"))[0]
    with np.load(victim) as z:
        outs = {k: z[k].copy() for k in z.files}
    outs["arr_1"][5] ^= 1
    np.savez(victim, **outs)
    cmd = [
        sys.executable,
        "-m",
        "medusa.cli",
        "trace",
        "record",
        "--mode",
        "restore",
        "-o",
        str(tmp_path / "r-%p.mtr"),
        "--",
        sys.executable,
        str(PROGRAMS / "caching_allocator.py"),
        str(lib),
        "restore",
        "--artifact",
        str(work / "art"),
        "--ref",
        str(ref),
    ]
    res = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        f"MISMATCH: graph 1 (batch 2): {victim.stem}: 1 of 2048 bytes differ, the first at "
        "byte 5" in res.stdout
    )
    assert res.stdout.splitlines()[-2] == "caching-allocator restore: bit-identical 2/3 graphs"
