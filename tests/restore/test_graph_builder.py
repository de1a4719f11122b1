"""The C graph builder leaves nothing behind but the executable graphs it hands out: each graph
is destroyed once instantiated, and a build that fails (a node it refuses, an upload that fails)
leaves neither graph nor exec (simcuda counts both: simcudaCountLive). A captured 2-D fill, whose
pitch no recording keeps, is refused by materialize, naming the node."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from medusa.artifact.layout import ATTR, FUNC, NODE, PARAM, RELOC, pack_edges
from medusa.cuda import load_backend
from medusa.restore.builder import GraphBuilder, name_kernel
from medusa.trace import NodeType
from tests.processes import medusa

PROGRAMS = Path(__file__).parent / "programs"
WIDTH = 64


@pytest.fixture(scope="module")
def sim():  # type: ignore[no-untyped-def]
    return load_backend("sim")


def _live(b) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    count = b._fn("simcudaCountLive", ctypes.c_uint64, [ctypes.c_int])
    return count(0), count(1)  # graphs, execs


def _build(b, buf: int, stream: int, height: int = 1) -> tuple[int, str, int]:  # type: ignore[no-untyped-def]
    """A graph that fills buf with 7s, then an empty node after it."""
    nodes = np.zeros(2, NODE)
    nodes[0]["type"], nodes[1]["type"] = NodeType.MEMSET, NodeType.EMPTY
    nodes[0]["width"], nodes[0]["height"], nodes[0]["value"], nodes[0]["elem"] = WIDTH, height, 7, 1
    nodes[0]["reloc_len"] = 1
    relocs = np.zeros(1, RELOC)  # word 0 (the destination) = allocation 0 + 0
    builder = GraphBuilder([np.array([buf], np.uint64)] + [np.zeros(0, np.uint64)] * 3)
    edges, none = pack_edges([[0, 1, 0, 0, 0]]), np.zeros(0, ATTR)
    return builder.build(nodes, np.zeros(1, np.uint8), relocs, edges, none,
                         np.zeros(0, FUNC), np.zeros(0, PARAM), stream)  # fmt: skip


def test_built_graphs_leave_only_their_execs(sim):
    buf, stream = sim.malloc(WIDTH), sim.stream_create()
    graphs, execs = _live(sim)
    built = []
    for _ in range(5):
        code, err, exec_ = _build(sim, buf, stream)
        assert code == 0, err
        built.append(exec_)
    assert _live(sim) == (graphs, execs + 5)
    sim.graph_launch(built[0], stream)
    sim.stream_synchronize(stream)
    assert sim.memcpy_dtoh(buf, WIDTH) == b"\7" * WIDTH
    for exec_ in built:
        sim.call("cudaGraphExecDestroy", ctypes.c_void_p(exec_))
    assert _live(sim) == (graphs, execs)


def test_a_failed_upload_leaves_no_exec_and_no_graph(sim):
    buf = sim.malloc(WIDTH)
    before = _live(sim)
    code, err, exec_ = _build(sim, buf, stream=0xDEAD0000)  # no such stream
    assert code != 0 and exec_ == 0
    assert err == "cuGraphUpload failed: CUDA_ERROR_INVALID_HANDLE (400)"  # the call, its error
    assert _live(sim) == before


def test_a_kernel_node_the_driver_refuses_is_named_with_its_kernel(sim):
    nodes = np.zeros(1, NODE)
    nodes[0]["type"], nodes[0]["grid"], nodes[0]["block"] = NodeType.KERNEL, 1, 1
    funcs = np.zeros(1, FUNC)
    funcs[0]["func"] = 0xDEAD0000  # no such CUfunction
    before = _live(sim)
    code, err, exec_ = GraphBuilder([np.zeros(0, np.uint64)] * 4).build(
        nodes, np.zeros(1, np.uint8), np.zeros(0, RELOC), pack_edges([]), np.zeros(0, ATTR),
        funcs, np.zeros(0, PARAM), sim.stream_create(),
    )  # fmt: skip
    assert code != 0 and exec_ == 0 and _live(sim) == before
    assert name_kernel(err, nodes, [{"name": "_Z6decodePf"}]) == (
        "node 0 (type 0): cuGraphAddKernelNode failed: CUDA_ERROR_INVALID_HANDLE (400) "
        "[kernel _Z6decodePf]"
    )


def test_a_2d_fill_in_a_plan_is_refused_and_leaves_no_graph(sim):
    buf, stream = sim.malloc(2 * WIDTH), sim.stream_create()
    before = _live(sim)
    code, err, exec_ = _build(sim, buf, stream, height=2)
    assert code != 0 and exec_ == 0
    assert err.startswith("node 0 (type 2): it is a 2-D fill, and the recording keeps no pitch")
    assert _live(sim) == before


@pytest.mark.e2e
def test_a_captured_2d_fill_is_refused_by_materialize_naming_the_node(tmp_path):
    program = PROGRAMS / "memset2d.py"
    plain = subprocess.run([sys.executable, str(program), "record"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert plain.stdout.split()[:6] == ["rows", "filled", "4", "gaps", "kept", "4"]  # pitched
    res = medusa("materialize", "--command", "--skip-phase", "graph_capture", "--out",
                 str(tmp_path / "art"), "--", sys.executable, str(program), "record")  # fmt: skip
    assert res.returncode != 0
    assert (
        "graph 0, node 0: a fill of 4 rows, whose pitch the recording does not keep: restore "
        "rebuilds 1-D fills only" in res.stdout + res.stderr
    )
    assert not (tmp_path / "art" / "manifest.json").exists()
