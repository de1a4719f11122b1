"""Restore of what a real GPU graph may hold beyond plain kernels: a cooperative kernel (its
parameters must go as kernelParams, never a packed buffer), an access-policy window whose base is
a pointer, a 2-D copy or fill the recording cannot rebuild, and a start-up that goes on after the
graph stage (phases that have not run yet when the restore does)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from medusa.artifact import ArtifactError, load_artifact
from medusa.artifact.layout import ATTR, NODE, RELOC
from medusa.restore.validate import validate_plan
from medusa.trace import NodeType, recorder_env
from tests.processes import GENERAL, clean_env, copy_artifact, materialize_general, reseal

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAMS = Path(__file__).parent / "programs"
ATTRS = PROGRAMS / "launch_attrs.py"


def _run(program: Path, tmp: Path, *args: str, restore: bool) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    if restore:
        env = recorder_env(tmp / "r-%p.mtr", mode="restore", base=env)
        env["MEDUSA_SIM_MEMCHECK"] = "1"
    # NOTE: run through -c, so that the program imports this medusa (the working directory's),
    # not an installed one, as test_general does
    script = (
        f"import runpy, sys; sys.argv = [{str(program)!r}, *{list(args)!r}]; "
        f"runpy.run_path({str(program)!r}, run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def attrs_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("attrs") / "art"
    materialize_general(ATTRS, out)
    return out


def test_a_cooperative_kernel_with_a_window_is_restored_before_later_phases_run(
    attrs_artifact, tmp_path
):
    """The restore runs in its own phase, before "serve" has allocated anything: only the phases
    before the graph stage are checked."""
    assert [a[0] for a in load_artifact(attrs_artifact).plan["allocs"]].count("serve") == 3
    plain = _run(ATTRS, tmp_path, "record", restore=False)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == ["x", f"{2 * sum(range(256)):.2f}", "later", "3"]
    res = _run(ATTRS, tmp_path, "restore", str(attrs_artifact), restore=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout == plain.stdout


def test_the_window_base_is_relocated_to_the_allocation_it_lies_in(attrs_artifact):
    plan = load_artifact(attrs_artifact).plan
    (graph,) = plan["graphs"]
    relocs = np.frombuffer(plan["templates"][0]["relocs"] + graph["relocs"], RELOC)
    attrs = np.frombuffer(graph["attrs"], ATTR)
    (window,) = attrs[attrs["attr"] == 1]
    assert window["reloc_len"] == 1
    r = relocs[window["reloc_off"]]
    hot = next(i for i, a in enumerate(plan["allocs"]) if a[:2] == ["setup", 1])
    assert (r["offset"], r["kind"], r["target"], r["addend"]) == (0, 0, hot, 0)


def _resave(src: Path, dst: Path, edit) -> None:  # type: ignore[no-untyped-def]
    reseal(copy_artifact(src, dst), edit)


@pytest.mark.parametrize(
    ("kind", "shape", "why"),
    [
        (NodeType.MEMCPY, "height", "it is a 2-D or 3-D copy"),
        (NodeType.MEMCPY, "depth", "it is a 2-D or 3-D copy"),
        (NodeType.MEMSET, "height", "it is a 2-D fill, and the recording keeps no pitch"),
    ],
)
def test_a_2d_or_3d_copy_or_fill_is_refused_naming_its_graph_and_node(tmp_path, kind, shape, why):
    """A plan edited to hold one (materialize refuses to write such a plan)."""
    src = tmp_path / "general"
    materialize_general(GENERAL, src)

    node: dict[str, int] = {}

    def two_d(plan: dict) -> None:
        t = plan["templates"][0]
        rows = np.frombuffer(t["nodes"], NODE).copy()
        (i,) = np.flatnonzero(rows["type"] == kind)
        rows[i]["width"] //= 2  # one that fits its allocations, in two rows or slices
        rows[i][shape] = 2
        t["nodes"] = rows.tobytes()
        node["i"] = int(i)

    _resave(src, tmp_path / "art", two_d)
    res = _run(GENERAL, tmp_path, "restore", str(tmp_path / "art"), restore=True)
    assert res.returncode != 0
    assert f"graph 0: node {node['i']} (type {int(kind)}): {why}" in res.stderr


def _drop_layout(plan: dict) -> None:
    plan["funcs"][0]["layout"] = []


def _window_past_its_allocation(plan: dict) -> None:
    g = plan["graphs"][0]
    relocs = np.frombuffer(g["relocs"], RELOC).copy()
    relocs[-1]["addend"] = 1 << 30
    g["relocs"] = relocs.tobytes()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_drop_layout, "its kernel's parameter layout was not recorded"),
        (_window_past_its_allocation, "attribute of node 0: a relocation points outside"),
    ],
)
def test_a_plan_without_layouts_or_with_a_wild_window_is_refused(attrs_artifact, edit, message):
    plan = copy.deepcopy(load_artifact(attrs_artifact).plan)
    edit(plan)
    with pytest.raises(ArtifactError, match=message):
        validate_plan(plan, "ART")


def test_an_attribute_the_driver_refuses_is_named_with_the_call_and_its_error(
    attrs_artifact, tmp_path
):
    def too_much_shared_memory(plan: dict) -> None:
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, past any device's shared memory
        plan["funcs"][0]["attrs"] = [[8, 1 << 30]]
        name["kernel"] = plan["funcs"][0]["name"]

    name: dict[str, str] = {}
    _resave(attrs_artifact, tmp_path / "art", too_much_shared_memory)
    res = _run(ATTRS, tmp_path, "restore", str(tmp_path / "art"), restore=True)
    assert res.returncode != 0
    assert (
        f"kernel {name['kernel']}: re-applying attribute 8=1073741824 failed "
        "(cuFuncSetAttribute: CUDA_ERROR_INVALID_VALUE (1))"
    ) in res.stderr
