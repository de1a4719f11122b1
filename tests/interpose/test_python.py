"""A Python program recorded through ctypes, with the control API; the recorder in front of the
real libcudart from the CUDA toolkit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from medusa.trace import Ev, read_trace, recorder_env
from medusa.trace import records as R
from tests.conftest import lines
from tests.processes import without_medusa

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).parent / "scripts" / "python_engine.py"


def _python(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = without_medusa(env, "MEDUSA_SIM_")
    res = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res


def test_a_python_program_is_recorded_with_pauses_and_phase_marks(tmp_path):
    plain = lines(_python([str(SCRIPT)], dict(os.environ)).stdout)
    trace = tmp_path / "py.mtr"
    rec = lines(_python([str(SCRIPT)], recorder_env(trace)).stdout)
    assert plain["sum"] == rec["sum"] == str(sum(0.5 * i for i in range(1024)))
    assert (plain["active"], rec["active"]) == ("False", "True")
    t = read_trace(trace)
    assert t.complete
    allocs = [a.addr for a in t.of(R.Alloc, Ev.ALLOC)]
    assert int(rec["w"]) in allocs
    assert int(rec["scratch"]) not in allocs  # made while paused
    assert len(allocs) == 1  # the forked child's allocation stayed out of the parent's trace
    events = list(t.events(Ev.MARK, Ev.ALLOC, Ev.CAPTURE_BEGIN, Ev.PAUSE, Ev.RESUME))
    order = [type(e).__name__ + (f":{e.phase}" if isinstance(e, R.Mark) else "") for e in events]
    assert order == ["Pause", "Resume", "Mark:weights", "Alloc", "Mark:capture", "CaptureBegin"]
    (node,) = t.of(R.Node, Ev.NODE)
    assert node.params[:8] == int(rec["w"]).to_bytes(8, "little")


def _toolkit_cudart() -> Path | None:
    for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"):
        libs = sorted(Path(d).glob("libcudart.so.*"))
        if libs:
            return libs[0]
    return None


CHECK_CUDART = r"""
import ctypes, sys
interposer = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
cudart = ctypes.CDLL(sys.argv[2])
names = sys.argv[3].split(",")
libdl = ctypes.CDLL("libdl.so.2")
libdl.dlvsym.restype = ctypes.c_void_p
libdl.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
real_dlsym = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    libdl.dlvsym(None, b"dlsym", b"GLIBC_2.34") or libdl.dlvsym(None, b"dlsym", b"GLIBC_2.2.5"))
missing, unhooked = [], []
for n in names:
    if not real_dlsym(cudart._handle, n.encode()):
        missing.append(n)
    elif ctypes.cast(getattr(cudart, n), ctypes.c_void_p).value != ctypes.cast(
            getattr(interposer, n), ctypes.c_void_p).value:
        unhooked.append(n)
count = ctypes.c_int(-1)
err = cudart.cudaGetDeviceCount(ctypes.byref(count))
print("missing:", ",".join(missing))
print("unhooked:", ",".join(unhooked))
print("device count error:", err)
"""


def test_the_recorder_loads_in_front_of_the_toolkits_libcudart(tmp_path):
    cudart = _toolkit_cudart()
    if cudart is None:
        pytest.skip("no libcudart from a CUDA toolkit on this machine")
    from medusa.trace import interposer_path

    runtime = [
        line.split("(")[1].split(",")[0]
        for line in (Path(__file__).parents[2] / "interpose" / "hooks.def").read_text().splitlines()
        if line.startswith("H(cuda")
    ]
    env = recorder_env(tmp_path / "rt.mtr")
    out = lines(
        _python(
            ["-c", CHECK_CUDART, str(interposer_path()), str(cudart), ",".join(runtime)], env
        ).stdout
    )
    assert len(runtime) > 20
    # every hooked runtime symbol exists in the real libcudart, and a lookup hands back the hook
    assert out["missing"] == "" and out["unhooked"] == ""
    # and the real runtime still answers, with no driver here: the result passes through unchanged
    assert int(out["device count error"]) in (35, 100)
