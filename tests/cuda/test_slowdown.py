"""MEDUSA_SIM_SLOWDOWN: a device some times slower than the CPU, for unlike devices on one
machine (Tessera's executor): a kernel's thread waits, off the CPU, (F - 1) times the CPU time
the kernel took, and its results are the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

SCRIPT = """
import json, time
import numpy as np
from medusa.engine.device import Device
d = Device()
x, w, out = d.alloc(64 * 512 * 4), d.alloc(512 * 512 * 4), d.alloc(64 * 512 * 4)
rng = np.random.default_rng(0)
d.upload(x, rng.standard_normal((64, 512), dtype=np.float32))
d.upload(w, rng.standard_normal((512, 512), dtype=np.float32))
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(40):
    d.linear(out.ptr, x.ptr, w.ptr, 64, 512, 512, accumulate=False)
d.synchronize()
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                  "sum": float(d.download(out, np.float32, 64 * 512).sum())}))
"""


def run(slowdown: str) -> tuple[dict, str]:  # type: ignore[type-arg]
    env = {**os.environ, "MEDUSA_SIM_SLOWDOWN": slowdown, "OPENBLAS_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout), res.stderr


def test_a_slower_device_waits_off_the_cpu_and_computes_the_same():
    fast, _ = run("1")
    slow, _ = run("6")
    assert slow["sum"] == fast["sum"]
    # The waits are not CPU time: the slow run's CPU time stays near the fast run's, and its wall
    # time is about 6 times its CPU time. Other load on the machine only lengthens wall time, so
    # both bounds hold on a busy machine (a ratio against the fast run's wall time did not).
    assert slow["cpu"] < 2 * fast["cpu"], (fast, slow)
    assert slow["wall"] > 3 * slow["cpu"], (fast, slow)


def test_a_bad_factor_is_named_and_ignored():
    for bad in ("0.5", "fast"):
        out, err = run(bad)
        assert f"MEDUSA_SIM_SLOWDOWN={bad} ignored: give a factor from 1 to 1000" in err
