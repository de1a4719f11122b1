"""What the GPU build links and carries, checked with the toolkit alone (no GPU): the kernels
library of scripts/gpu/simcuda_parity.sh links the shared CUDA runtime (a static one would register
its kernels with a private runtime), the check refuses one that does not, and the CMake build of
the .cu libraries carries real sm_90 code unless CUDAARCHS says otherwise."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TESTKERNELS = ROOT / "csrc" / "kernels" / "cuda" / "testkernels.cu"
needs_nvcc = pytest.mark.skipif(
    not (shutil.which("nvcc") and shutil.which("readelf")), reason="no CUDA toolkit (nvcc)"
)


def _needed(lib: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True)
    lines = [line for line in out.stdout.splitlines() if "(NEEDED)" in line]
    return [line.rsplit("[", 1)[1].rstrip("]") for line in lines]


def _cuobjdump() -> str | None:
    """cuobjdump from PATH, the toolkit, or the copy Triton ships."""
    found = shutil.which("cuobjdump")
    toolkit = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "cuobjdump"
    spec = importlib.util.find_spec("triton")
    bundled = (
        Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if spec and spec.origin
        else None
    )
    for p in (found, toolkit, bundled):
        if p and Path(p).is_file():
            return str(p)
    return None


@needs_nvcc
def test_the_parity_kernels_library_links_the_shared_cuda_runtime(tmp_path):
    res = subprocess.run(
        ["bash", "scripts/gpu/simcuda_parity.sh", "--build-kernels", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "CUDA_ARCH": "sm_90"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert any(n.startswith("libcudart.so.") for n in _needed(tmp_path / "libgpukernels.so"))


@needs_nvcc
def test_a_kernels_library_with_a_static_runtime_is_refused(tmp_path):
    lib = tmp_path / "libstatic.so"
    subprocess.run(
        ["nvcc", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", str(TESTKERNELS), "-o", str(lib)],
        check=True,
        timeout=300,
    )  # nvcc's default: the runtime linked in statically
    res = subprocess.run(
        ["bash", "scripts/gpu/lib/check_needed.sh", str(lib), "libcudart.so"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1
    assert f"FAIL {lib} does not link libcudart.so (NEEDED: " in res.stdout


def _cmake_testkernels(tmp_path: Path, env: dict[str, str]) -> Path:
    build = tmp_path / "build"
    for cmd in (
        ["cmake", "-S", str(ROOT), "-B", str(build), "-DMEDUSA_BUILD_CUDA=ON"],
        ["cmake", "--build", str(build), "--target", "medusa_testkernels_cuda"],
    ):
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return build / "csrc" / "kernels" / "cuda" / "libmedusa_testkernels_cuda.so"


@needs_nvcc
@pytest.mark.skipif(_cuobjdump() is None, reason="no cuobjdump")
@pytest.mark.parametrize("cudaarchs,want", [(None, "sm_90"), ("80-real", "sm_80")])
def test_the_cuda_build_carries_real_code_for_the_architecture(tmp_path, cudaarchs, want):
    env = {k: v for k, v in os.environ.items() if k != "CUDAARCHS"}
    if cudaarchs:
        env["CUDAARCHS"] = cudaarchs
    lib = _cmake_testkernels(tmp_path, env)
    elves = subprocess.run(
        [str(_cuobjdump()), "--list-elf", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    archs = sorted({line.rsplit(".", 2)[-2] for line in elves.splitlines() if ".cubin" in line})
    assert want in archs
    if cudaarchs:
        assert archs == [want]  # the override replaces the default
    assert any(n.startswith("libcudart.so.") for n in _needed(lib))


def test_the_gpu_check_scripts_parse():
    for py in sorted((ROOT / "scripts" / "gpu").glob("*.py")):
        compile(py.read_text(), str(py), "exec")  # a SyntaxError fails the test, naming the file
    for sh in sorted((ROOT / "scripts" / "gpu").glob("*.sh")):
        res = subprocess.run(["bash", "-n", str(sh)], capture_output=True, text=True)
        assert res.returncode == 0, f"{sh}: {res.stderr}"


@needs_nvcc
def test_the_weaver_poll_check_compiles_without_warnings(tmp_path):
    res = subprocess.run(
        ["nvcc", "-arch=sm_90", "-O2", "-Werror=all-warnings", f"-I{ROOT / 'csrc/kernels/cuda'}",
         str(ROOT / "scripts/gpu/weaver_poll_check.cu"), "-o", str(tmp_path / "check")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
