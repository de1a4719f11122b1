"""simcuda's access recording on a small graph whose accesses are known, and the cross-check
against the two-run pointer classification."""

from __future__ import annotations

from pathlib import Path

import pytest

from medusa.tessera import depgraph
from medusa.tessera.accesses import READ, WRITE, analyze
from medusa.tessera.crosscheck import crosscheck
from medusa.trace import read_trace, recorder_env
from medusa.trace.run_view import DEVICE, RunView
from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAMS = Path(__file__).parent / "programs"
A, B, C, D, IDLE, PTRS = ((DEVICE, i) for i in range(6))  # allocation order in accesses.c


@pytest.fixture(scope="module")
def runs(cprog, run, tmp_path_factory):
    prog = cprog("accesses", src_dir=PROGRAMS)
    tmp = tmp_path_factory.mktemp("acc")
    plain = run(prog, "replay")
    traced = run(prog, "replay", env={**recorder_env(tmp / "a.mtr"), "MEDUSA_SIM_ACCESSES": "1"})
    run(prog, env={**recorder_env(tmp / "b.mtr"), "MEDUSA_TRACE_SHIFT": str(1 << 20)})
    eager = run(prog, env={**recorder_env(tmp / "e.mtr"), "MEDUSA_SIM_ACCESSES": "1"})
    views = [RunView.build(read_trace(tmp / f"{n}.mtr")) for n in "abe"]
    return plain, traced, eager, views


def test_instrumentation_changes_no_result(runs):
    plain, traced, eager, _ = runs
    assert lines(plain.stdout)["checksum"] == lines(traced.stdout)["checksum"]
    assert lines(eager.stdout)["checksum"] == lines(traced.stdout)["checksum"]


def test_each_node_reads_and_writes_what_its_kernel_does(runs):
    *_, (a, _, e) = runs
    for view, source in ((a, "replay"), (e, "warm-up")):
        add, scale, gather, unused = analyze(view)[0]
        assert add.source == source
        assert add.mode(A) == READ and add.mode(C) == WRITE
        assert add.mode(B) & READ  # (its last page is shared with c's first: written too)
        assert scale.extents == {C: [(0, 16384, READ | WRITE)]}
        assert gather.mode(PTRS) == READ and gather.mode(D) == WRITE
        assert {A, C} <= gather.indirect  # reached through the pointer array
        assert unused.extents == {} and len(unused.pointers) == 3


def test_a_pointer_never_dereferenced_is_reported(runs):
    *_, (a, b, _) = runs
    check = crosscheck(a, b)
    assert check.nodes_checked == 4 and check.nodes_unknown == 0
    assert [(d.node, d.byte, d.pointer, d.dereferenced) for d in check.disagreements] == [
        (3, 0, True, False),
        (3, 8, True, False),
        (3, 16, True, False),
    ]
    assert "never dereferences" in str(check.disagreements[0])


def test_dependencies_follow_the_data(runs):
    *_, (a, _, _) = runs
    nodes = analyze(a)[0]
    g = depgraph.build([n.extents for n in nodes], [n.indirect for n in nodes])
    assert (0, 1) in g.edges and (1, 2) in g.edges  # c = a + b; c *= 2; d = gather(a, c)
    assert (0, 3) not in g.edges and (2, 3) not in g.edges
    assert g.pinned and {2} < g.pinned[0]  # the indirect kernel stays with c's writers
