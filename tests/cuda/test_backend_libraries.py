"""The GPU back-end loads every library whose functions Python calls by name. libsimcuda is
runtime and driver in one, so on simcuda a driver function (cuDeviceGetName) resolves whatever
else is loaded; on a GPU libcudart opens libcuda.so.1 privately, and the first lent H200
(2026-11-27) failed every materialize with "undefined symbol: cuDeviceGetName"."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

import pytest

from medusa.cuda import backend

SOURCE = Path(backend.__file__).read_text()


def _driver_names() -> set[str]:
    """Driver (cu*, not cuda*) functions backend.py looks up by name in the global scope."""
    return set(re.findall(r'"(cu(?!da)[A-Z]\w*)"', SOURCE))


def test_backend_calls_some_driver_function() -> None:
    assert "cuDeviceGetName" in _driver_names()


def test_the_gpu_back_end_loads_the_driver_for_its_driver_calls() -> None:
    try:
        libs = backend.libraries("cuda")
    except FileNotFoundError:
        pytest.skip("no libcudart here (no CUDA toolkit)")
    assert backend.DRIVER in [str(p) for p in libs]
    runtime = ctypes.CDLL(str(libs[0]), mode=os.RTLD_LOCAL)
    exported_by_runtime = {n for n in _driver_names() if hasattr(runtime, n)}
    # These resolve only because the driver is loaded too.
    assert exported_by_runtime == set(), exported_by_runtime
