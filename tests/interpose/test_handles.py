"""The recorder on a driver as strict as the real one: fatbin wrappers, CUkernel and CUfunction
handles, a library's module, an older driver, a driver loaded privately."""

from __future__ import annotations

from pathlib import Path

import pytest

from medusa.cuda.paths import lib_dir
from medusa.trace import Ev, read_trace, recorder_env
from medusa.trace import records as R
from tests.conftest import lines

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAMS = Path(__file__).parent / "programs"


def _record(cprog, run, tmp_path: Path, name: str, prog: str = "recorded", **env: str):
    trace = tmp_path / f"{name}.mtr"
    res = run(cprog(prog, src_dir=PROGRAMS), env={**recorder_env(trace), **env})
    return res, read_trace(trace)


def test_a_registered_fatbin_wrapper_is_hashed_by_the_image_it_points_to(cprog, run, tmp_path):
    # the wrapper holds a pointer that differs per run; the image it points to does not
    (a,) = _record(cprog, run, tmp_path, "a", MEDUSA_SIM_SEED="1")[1].of(R.Load, Ev.LOAD)
    _, t = _record(cprog, run, tmp_path, "b", MEDUSA_SIM_SEED="2")
    (b,) = t.of(R.Load, Ev.LOAD)
    assert a.api == "cuLibraryLoadData" and a.sha256 == b.sha256
    image = t.image(b.sha256)
    assert image is not None and image.startswith(b"SIMCUBIN") and len(image) == b.size


def test_a_kernel_and_its_function_keep_their_layout_and_image(cprog, run, tmp_path):
    _, first = _record(cprog, run, tmp_path, "img")
    (load,) = first.of(R.Load, Ev.LOAD)
    image = first.images_dir / f"{load.sha256}.img"
    res, t = _record(cprog, run, tmp_path, "k", "kernel_handles", IMAGE=str(image))
    out = lines(res.stdout)
    funcs = {f.func: f for f in t.of(R.Func, Ev.FUNC)}
    kernel, function = funcs[int(out["kernel"])], funcs[int(out["function"])]
    images = t.loaded_images()
    for f in (kernel, function):
        assert f.name == "scale_inplace" and f.params == ((0, 8), (8, 4), (12, 4))
    # a CUkernel names its library; a CUfunction its module, which is the library's module
    assert images[kernel.library] == load.sha256 and kernel.module == function.module
    assert function.library == 0 and images[function.module] == load.sha256
    assert not t.stopped


@pytest.mark.parametrize("version", ["12030"])
def test_without_a_parameter_query_the_recorder_stops_and_says_why(cprog, run, tmp_path, version):
    plain = run(cprog("recorded", src_dir=PROGRAMS), env={"MEDUSA_SIM_DRIVER_VERSION": version})
    res, t = _record(cprog, run, tmp_path, "old", MEDUSA_SIM_DRIVER_VERSION=version)
    assert lines(res.stdout)["checksum"] == lines(plain.stdout)["checksum"]  # the program goes on
    assert "recording stopped" in res.stderr
    assert "the driver (CUDA 12.3) has neither cuFuncGetParamInfo nor cuKernelGetParamInfo" in (
        t.stopped
    )


def test_a_12_4_driver_records_layouts_with_cuFuncGetParamInfo(cprog, run, tmp_path):
    _, t = _record(cprog, run, tmp_path, "v124", MEDUSA_SIM_DRIVER_VERSION="12040")
    funcs = {f.name: f for f in t.of(R.Func, Ev.FUNC)}
    assert funcs["vector_add"].params == ((0, 8), (8, 8), (16, 8), (24, 4))
    assert not t.stopped


def test_a_driver_loaded_privately_is_found_behind_a_hooked_name(cprog, run, tmp_path):
    prog = cprog("private_driver", src_dir=PROGRAMS, libs=())
    trace = tmp_path / "p.mtr"
    res = run(prog, str(lib_dir() / "libsimcuda.so"), env=recorder_env(trace))
    assert lines(res.stdout) == {"init": "0", "alloc": "0"}
    (alloc,) = read_trace(trace).of(R.Alloc, Ev.ALLOC)
    assert alloc.api == "cuMemAlloc_v2" and alloc.size == 4096
