"""What the artifact saves of a buffer that a graph needs: bounded per allocation."""

from __future__ import annotations

import sys

import pytest

from tests.processes import medusa

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

BIG = """
import ctypes
from medusa import trace
from medusa.cuda import load_backend
b = load_backend("sim")
b.load_kernels("simcuda_testkernels")
stream = b.stream_create()
trace.mark("graph_capture")
size = 65 << 20
big = b.malloc(size)  # made by the skipped phase, and read by the graph: its contents are needed
b.memset(big, 1, size)
b.begin_capture(stream)
b.launch("scale_inplace", 1, 32, [big, ctypes.c_float(1.0), 1024], stream=stream)
b.graph_instantiate(b.end_capture(stream))
trace.mark("ready")
"""


def test_a_buffer_too_large_to_save_is_refused(tmp_path):
    cmd = ["materialize", "--command", "--skip-phase", "graph_capture", "--out", str(tmp_path)]
    res = medusa(*cmd, "--", sys.executable, "-c", BIG)
    assert res.returncode != 0
    assert "bounded at 64 MiB per allocation" in res.stderr
