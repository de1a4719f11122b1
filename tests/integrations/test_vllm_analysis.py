"""The vLLM artifact's graph section, from two real recordings on simcuda of a program shaped
like a vLLM start-up: descriptor keys point at the right plan graphs, output tensors become
(allocation, offset) that a restored process finds its graphs' outputs at, and sidecars that do
not match the traces are refused. (No vLLM needed.)"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.artifact import ArtifactError
from medusa.integrations.vllm.analysis import graph_section
from medusa.integrations.vllm.phases import SKIPPED
from medusa.integrations.vllm.schema import vllm_section
from medusa.materialize.analysis import MaterializeError
from medusa.materialize.driver import analyze_runs, record_run, write_artifact
from medusa.restore.errors import RestoreError
from medusa.restore.scaled import scaled_plan
from medusa.restore.validate import validate_plan
from medusa.trace import recorder_env
from tests.processes import clean_env

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAM = Path(__file__).parent / "programs" / "vllm_like.py"


def CAPTURE(phase: str) -> bool:  # noqa: N802  (the phases a vLLM restore skips)
    return phase in SKIPPED


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm-like")
    sides = []
    for run in (0, 1):
        cmd = [sys.executable, str(PROGRAM), "record", str(work / f"{run}.side.json")]
        record_run(cmd, work / f"{run}.mtr", run, "sim", lambda _m: None)
        sides.append(json.loads((work / f"{run}.side.json").read_text()))
    a, b, plan, _ = analyze_runs(work / "0.mtr", work / "1.mtr", set(SKIPPED), lambda _m: None)
    plain = subprocess.run(
        [sys.executable, str(PROGRAM), "record", str(work / "plain.json")],
        env=clean_env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return work, a, b, plan, sides, plain.stdout.strip()


EXPECTED = "n=256 hidden 163200.0 n=128 hidden 40640.0 piece 24384.0"


def _artifact(out: Path, plan: dict, joined: dict) -> Path:
    """What materialize_vllm writes, with this program's values."""
    section = vllm_section(
        version="test", kv_cache_memory_bytes=0, cudagraph_mode="FULL_AND_PIECEWISE",
        graphs=joined["graphs"], compile_cache={"dir": None, "sha256": None, "files": 0},
        outputs=joined["outputs"], wrappers=joined["wrappers"],
    )  # fmt: skip
    manifest = {
        "kind": "vllm",
        "model": {"identity": "vllm:test", "name": "vllm-like"},
        "engine": {"name": "vllm", "argv": ["vllm-like"]},
        "device": {},
        "vllm": section,
        "graphs": {
            "count": len(plan["graphs"]),
            "keys": [],
            "nodes": plan["num_nodes"],
            "templates": len(plan["templates"]),
        },
        "relocations": plan["relocations"],
    }  # fmt: skip
    write_artifact(out, manifest, plan, {}, {}, lambda _m: None)
    return out


def _restore(art: Path, tmp_path: Path, blocks: int) -> subprocess.CompletedProcess:
    env = recorder_env(tmp_path / "r-%p.mtr", mode="restore", base=clean_env())
    env["MEDUSA_SIM_MEMCHECK"] = "1"
    return subprocess.run(
        [sys.executable, str(PROGRAM), "restore", str(art), str(blocks)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_outputs_are_relocated_and_a_restored_process_finds_them(recorded, tmp_path):
    work, a, b, plan, (side_a, side_b), plain = recorded
    assert side_a["graphs"][1]["output"]["addr"] != side_b["graphs"][1]["output"]["addr"]
    joined = graph_section(a, b, side_a, side_b, CAPTURE, plan)
    piece = joined["graphs"][1]["output"]
    pool = a.allocs[piece["alloc"]]
    assert (pool.phase, pool.size, piece["offset"]) == ("graph_capture", 8 * 256, 4 * 256)
    assert "addr" not in piece and piece["shape"] == [128]
    hidden = joined["outputs"]["hidden_states"]
    assert a.allocs[hidden["alloc"]].size == 4 * 256 and hidden["offset"] == 0
    assert joined["outputs"]["intermediate_tensors"] == {"t": "none"}
    res = _restore(_artifact(tmp_path / "art", plan, joined), tmp_path, 8)
    assert res.returncode == 0, res.stderr
    # the graphs write and read the native scratch block; simcuda hands the restored process
    # poisoned memory, so a wrong or missing replay of that block shows in the sums
    assert res.stdout.strip() == plain == EXPECTED
    # recorded at one KV size only: a KV cache of another size is refused, not half-used
    other = _restore(tmp_path / "art", tmp_path, 12)
    assert other.returncode != 0
    assert re.search(r"allocation #\d+ \(phase 'kv_alloc' #0\) is \d+ bytes here", other.stderr)


def test_recorded_at_two_kv_sizes_graphs_restore_onto_a_kv_cache_of_any_size(tmp_path):
    # vLLM's value cache starts after num_blocks key blocks: a graph's pointer to it moves with
    # the block count. Recorded at 8 and 6 blocks, the plan keeps that pointer's slope (one
    # page per block) and a restore with 4, 8 or 12 blocks reads the values where they are.
    sides = []
    for run, blocks in ((0, 8), (1, 6)):
        side = tmp_path / f"{run}.side.json"
        cmd = [sys.executable, str(PROGRAM), "record", str(side), str(blocks)]
        record_run(cmd, tmp_path / f"{run}.mtr", run, "sim", lambda _m: None)
        sides.append(json.loads(side.read_text()))
    assert [s["kv_blocks"] for s in sides] == [8, 6]
    a, b, plan, _ = analyze_runs(tmp_path / "0.mtr", tmp_path / "1.mtr", set(SKIPPED),
                                 lambda _m: None, scale_by=("kv_alloc", 8, 6))  # fmt: skip
    assert plan["scale"]["count"] == 8 and [r[3] for r in plan["scale"]["relocs"]] == [4 * 256] * 2
    art = _artifact(tmp_path / "art", plan, graph_section(a, b, *sides, CAPTURE, plan))
    for blocks in (4, 8, 12):
        res = _restore(art, tmp_path, blocks)
        assert (res.returncode, res.stdout.strip()) == (0, EXPECTED), res.stderr
    # a plan whose count-following relocation names one that points elsewhere is refused whole
    bad = copy.deepcopy(plan)
    bad["scale"]["relocs"][0][2] = 0  # the first relocation of its table: the input, not the KV
    with pytest.raises(ArtifactError, match="points outside the scaled allocations; materialize"):
        validate_plan(bad, "art")
    crafted = [
        ({"count": 1 << 62}, "count must be between 1 and"),
        ({"phase": "graph_capture"}, "is one the restore replays"),
        ({"relocs": plan["scale"]["relocs"] * 2}, "a relocation is listed twice"),
    ]
    for change, why in crafted:
        with pytest.raises(ArtifactError, match=why):
            validate_plan({**plan, "scale": {**plan["scale"], **change}}, "art")
    # a count whose shift leaves int64 is refused by the restore, not an OverflowError
    steep = {**plan, "scale": {**plan["scale"], "relocs": [[0, 0, 8, 1 << 40]]}}
    with pytest.raises(RestoreError, match="the KV cache is too small for them"):
        scaled_plan(steep, 1 << 30)


def test_sidecars_that_do_not_match_the_traces_are_refused(recorded):
    _, a, b, _, (side_a, side_b), _ = recorded
    extra = copy.deepcopy(side_b)
    extra["captures"] = 3
    with pytest.raises(MaterializeError, match="holds 2 captured graphs, vLLM captured 3"):
        graph_section(a, b, side_a, extra, CAPTURE)
    other = copy.deepcopy(side_b)
    other["graphs"][0]["key"]["fields"]["num_tokens"] = 8
    with pytest.raises(MaterializeError, match="captured different graphs"):
        graph_section(a, b, side_a, other, CAPTURE)
    stray = copy.deepcopy(side_b)
    stray["outputs"]["hidden_states"]["addr"] = 16  # nothing was ever allocated there
    with pytest.raises(MaterializeError, match="lies in no live allocation"):
        graph_section(a, b, side_a, stray, CAPTURE)
    moved = copy.deepcopy(side_b)
    moved["outputs"]["hidden_states"]["addr"] += 4  # another offset in the other run
    with pytest.raises(MaterializeError, match=r"allocation #\d+\+0 in one run and #\d+\+4"):
        graph_section(a, b, side_a, moved, CAPTURE)


def test_an_output_in_memory_made_before_the_capture_is_refused(recorded):
    # e.g. a hidden-states buffer torch carved from an older segment: a restored process could
    # not keep torch from handing that memory out again
    _, a, b, _, (side_a, side_b), _ = recorded
    inp = [x for x in a.allocs if x.phase == "load_model"][0]
    inp_b = b.allocs[inp.index]
    early_a, early_b = copy.deepcopy(side_a), copy.deepcopy(side_b)
    early_a["outputs"]["hidden_states"]["addr"] = inp.addr
    early_b["outputs"]["hidden_states"]["addr"] = inp_b.addr
    with pytest.raises(MaterializeError, match="phase 'load_model'.*made before the graph capture"):
        graph_section(a, b, early_a, early_b, CAPTURE)


def test_a_buffer_made_during_the_capture_that_graphs_use_must_be_a_rebuilt_output(recorded):
    # The pool's first half is graph 0's intermediate: were it a live tensor vLLM holds (its
    # owner would make another in a restored process), the artifact would be wrong.
    _, a, b, plan, (side_a, side_b), _ = recorded
    pool = side_a["graphs"][1]["output"]["addr"] - 4 * 256
    held = copy.deepcopy(side_a)
    held["capture_live"].append([pool, 4 * 256])
    with pytest.raises(MaterializeError, match=r"1024-byte buffer vLLM created during the capture"):
        graph_section(a, b, held, side_b, CAPTURE, plan)
    unused = copy.deepcopy(side_a)
    unused["capture_live"] = [[pool + 8 * 256 - 8, 8]]  # no graph touches its last float pair
    graph_section(a, b, unused, side_b, CAPTURE, plan)


def test_a_native_buffer_made_during_the_capture_is_replayed_not_refused(recorded):
    # PyTorch's cuBLAS/cuBLASLt workspace for the capture stream: graphs use it, no Python
    # object holds it; the restore replays its capture-phase allocation, so it is allowed ...
    _, a, b, plan, (side_a, side_b), _ = recorded
    ws = [blk for blk in side_a["capture_live"] if blk[2] == "native"]
    assert len(ws) == 1
    graph_section(a, b, side_a, side_b, CAPTURE, plan)
    # ... but the same block held by a Python object would be remade by its owner ...
    owned = copy.deepcopy(side_a)
    owned["capture_live"] = [[ws[0][0], ws[0][1], "python"]]
    with pytest.raises(MaterializeError, match=r"1024-byte buffer vLLM created during the capture"):
        graph_section(a, b, owned, side_b, CAPTURE, plan)
    # ... and a sidecar that does not say who holds a block counts as Python-held
    old = copy.deepcopy(side_a)
    old["capture_live"] = [ws[0][:2]]
    with pytest.raises(MaterializeError, match="vLLM created during the capture"):
        graph_section(a, b, old, side_b, CAPTURE, plan)


def test_a_native_buffer_in_memory_older_than_the_capture_is_refused(recorded):
    # torch carved the workspace from a segment made before the capture: in a restored process
    # that memory is torch's to hand out again while the graphs write there
    _, a, b, plan, (side_a, side_b), _ = recorded
    inp = [x for x in a.allocs if x.phase == "load_model"][0]
    early = copy.deepcopy(side_a)
    early["capture_live"] = [[inp.addr, inp.size, "native"]]  # the graphs read the input
    with pytest.raises(MaterializeError, match=r"native buffer .*\(phase 'load_model'\), which is"):
        graph_section(a, b, early, side_b, CAPTURE, plan)
