"""A kernel's parts on several of simcuda's threads (simcudaParallel, MEDUSA_SIM_THREADS; the
suite's default racecheck keeps them on one): every part runs once, a fault or trap in a part on
another thread fails the launch as the kernel's would, never the process, and HybridGEMM's tiles
give the same bits on one thread or four."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

SCRIPT = """
import ctypes, hashlib, json, sys
import numpy as np
from medusa.c2c.hybrid import hybrid_gemm
from medusa.cuda import load_backend
from medusa.cuda.errors import CudaError
from medusa.engine.hybrid_gemm import Tiles

b = load_backend("sim")
b.load_kernels("medusa_kernels")
m, n, k, alpha = 64, 1000, 300, float(sys.argv[1])
rng = np.random.default_rng(5)
xs, ws = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
x, o = b.malloc(xs.nbytes), b.malloc(m * n * 4)
b.memcpy_htod(x, xs.tobytes())
p, w = ctypes.c_void_p(), ctypes.c_void_p()
b.call("cudaHostAlloc", ctypes.byref(p), ctypes.c_size_t(ws.nbytes), ctypes.c_uint(2))
ctypes.memmove(p.value, ws.tobytes(), ws.nbytes)
b.call("cudaHostGetDevicePointer", ctypes.byref(w), p, ctypes.c_uint(0))
tiles = Tiles(bm=16, bn=24, bk=64, wbm=16, wbn=24, wbk=64)
w_ptr = int(w.value)
try:
    hybrid_gemm(b, o, x, w_ptr, m, n, k, alpha, tiles)
    got = np.frombuffer(b.memcpy_dtoh(o, m * n * 4), np.float32).reshape(m, n)
except CudaError as e:
    print(json.dumps({"error": str(e)}))
    sys.exit(0)
print(json.dumps({"bits": hashlib.sha256(got.tobytes()).hexdigest(),
                  "err": float(np.abs(got - xs @ ws.T).max())}))
"""


def _answer(script: str, args: list[str], threads: int, racecheck: str = "0") -> dict:  # type: ignore[type-arg]
    """SCRIPT's last line (JSON), run in a fresh process with that many simcuda threads."""
    env = {**os.environ, "MEDUSA_SIM_THREADS": str(threads), "MEDUSA_SIM_RACECHECK": racecheck}
    res = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def run(threads: int, alpha: float) -> dict:  # type: ignore[type-arg]
    return _answer(SCRIPT, [str(alpha)], threads)


@pytest.mark.parametrize("alpha", [0.0, 0.4, 1.0])
def test_the_same_bits_on_one_thread_or_four_and_every_column_once(alpha):
    one, four = run(1, alpha), run(4, alpha)
    assert one["bits"] == four["bits"]
    assert four["err"] < 1e-3  # a column skipped or added twice is off by its whole value


PARTS = """
import ctypes, json, sys
import numpy as np
from medusa.cuda import load_backend
from medusa.cuda.errors import CudaError

b = load_backend("sim")
b.load_kernels("simcuda_testkernels")
parts, bad, mode = 64, int(sys.argv[1]), int(sys.argv[2])
out = b.malloc(parts * 4)
b.memcpy_htod(out, bytes(parts * 4))
c = ctypes.c_int
try:
    b.launch("parts_kernel", 1, 1, [out, c(parts), c(bad), c(mode)])
    print(json.dumps({"out": np.frombuffer(b.memcpy_dtoh(out, parts * 4), np.int32).tolist()}))
except CudaError as e:
    print(json.dumps({"error": str(e)}))
"""


def parts(bad: int, mode: int, racecheck: str = "0") -> dict:  # type: ignore[type-arg]
    """simcuda_testkernels' parts_kernel on 4 threads: 64 parts, part 0 held until another
    part has begun (so parts run on other threads; 1000 added to its count if none did), part
    `bad` faulting (1) or trapping (2). The suite's default racecheck keeps parts on one thread."""
    return _answer(PARTS, [str(bad), str(mode)], 4, racecheck)


def test_every_part_runs_once_and_on_several_threads():
    assert parts(-1, 0) == {"out": [1] * 64}


def test_under_racecheck_the_parts_run_in_order_on_the_kernels_thread():
    assert parts(-1, 0, racecheck="1") == {"out": [1001] + [1] * 63}


@pytest.mark.parametrize("bad", [1, 40])
def test_a_fault_in_a_part_on_another_thread_is_the_kernels_illegal_address(bad):
    err = parts(bad, 1)["error"]
    assert "illegal address" in err and "parts_kernel" in err


def test_a_trap_in_a_part_on_another_thread_fails_the_launch_with_its_reason():
    err = parts(7, 2)["error"]
    assert "part trapped" in err
