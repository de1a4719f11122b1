"""What each GPU check prints becomes the figure column of all.sh's summary.json (the README's
figure table is filled from it). The benches' own lines are produced here on simcuda with a tiny
model; the lines of checks that need a GPU to print anything are given as they print them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from tests.engine.tiny_models import write_gguf

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

REPO = Path(__file__).parents[2]


def summarize(tmp: Path, logs: dict[str, str]) -> dict[str, dict]:
    lines = [f"{name}\tcheck\tok\t1.0\t" for name in logs]
    (tmp / "steps.tsv").write_text("\n".join(lines) + "\n")
    for name, text in logs.items():
        (tmp / f"{name}.log").write_text(text)
    py = REPO / "scripts" / "gpu" / "lib" / "summary.py"
    res = subprocess.run([sys.executable, str(py), str(tmp)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return {r["check"]: r for r in json.loads((tmp / "summary.json").read_text())["checks"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_gguf(path, [T.F16])
    return path


def bench(script: str, *args: str) -> str:
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / script), *args],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_coldstart_gives_ttft_and_graph_stage_per_1000_nodes(tmp_path, tiny):
    out = bench("coldstart.py", "--model", str(tiny), "--repeat", "1")
    fig = summarize(tmp_path, {"restore_parity": out})["restore_parity"]["figure"]
    assert "TTFT after process start: baseline " in fig and " s, restored " in fig
    assert "graph stage per 1000 nodes: capture " in fig and " ms vs restore " in fig
    assert re.search(r"restored TTFT [\d.]+ s = [\d.]+x the floor \([\d.]+x overlapped\)", fig)


def test_weights_gives_the_store_against_cudamemcpy_from_pinned_memory(tmp_path, tiny):
    out = bench("weights.py", "--model", str(tiny), "--repeat", "1", "--variants",
                "store,copy-pinned")  # fmt: skip
    fig = summarize(tmp_path, {"weight_store_smollm2": out})["weight_store_smollm2"]["figure"]
    assert fig.startswith("weight store vs cudaMemcpy from pinned memory: ") and "GB/s vs" in fig


def test_gpu_only_lines_become_figures(tmp_path):
    torch_log = (
        "captured 4 graphs\ntorch restore: bit-identical 4/4 graphs\n"
        "capture vs restore per 1000 nodes: 120.5 ms vs 3.2 ms\n"
    )
    gemm_log = (
        "alpha 0.00:  2.000 ms, weight bandwidth    33.5 GB/s\n"
        "alpha 0.50:  1.500 ms, weight bandwidth    44.7 GB/s, max err 0.01\n"
        "cudaMemcpy, pinned host -> device: 1.2 ms, 55.1 GB/s\n"
        "cuBLAS, device weights:   0.050 ms, weight bandwidth  1342.2 GB/s\n"
    )
    rows = summarize(tmp_path, {"torch_restore": torch_log, "hybridgemm_bandwidth": gemm_log})
    assert rows["torch_restore"]["figure"] == (
        "torch restore: bit-identical 4/4 graphs; "
        "capture vs restore per 1000 nodes: 120.5 ms vs 3.2 ms"
    )
    assert rows["hybridgemm_bandwidth"]["figure"] == (
        "alpha 0.50 44.7 GB/s; cudaMemcpy 55.1 GB/s; cuBLAS 1342.2 GB/s"
    )
