"""csrc/kernels/cuda/hybridgemm.cu's tiling, run on the CPU (tests/c2c/cu/hybridgemm_host.cpp: a
block's threads are std::threads meeting at a barrier): it equals numpy for ragged shapes, every
split, half-precision inputs, a grid smaller than the tile count, and output tiles larger than a
block's registers hold in one sweep of K. Its speed on a GPU, against cudaMemcpy and cuBLAS, is
scripts/gpu/hybridgemm_bandwidth.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from medusa.engine.hybrid_gemm import MAX_SHARED, Tiles, launch_shape

ROOT = Path(__file__).resolve().parents[2]
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory) -> Path:
    if not shutil.which("g++") or not (CUDA_INCLUDE / "cuda_fp16.h").is_file():
        pytest.skip("needs g++ and the CUDA toolkit's headers (cuda_fp16.h)")
    exe = tmp_path_factory.mktemp("hg") / "hybridgemm_host"
    subprocess.run(
        ["g++", "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
         f"-I{CUDA_INCLUDE}", f"-I{ROOT / 'csrc/kernels/cuda'}",
         str(ROOT / "tests/c2c/cu/hybridgemm_host.cpp"), "-o", str(exe), "-pthread"],
        check=True, timeout=300,
    )  # fmt: skip
    return exe


def _inputs(m: int, n: int, k: int, dtype: str) -> tuple[bytes, bytes, np.ndarray]:
    """X and W as the kernel reads them, and the exact fp32 product of what they hold."""
    rng = np.random.default_rng(m * 1000 + n + k)
    x32 = rng.standard_normal((m, k)).astype(np.float32)
    w32 = rng.standard_normal((n, k)).astype(np.float32)
    if dtype == "float16":
        x_in, w_in = x32.astype(np.float16), w32.astype(np.float16)
        x32, w32 = x_in.astype(np.float32), w_in.astype(np.float32)
    elif dtype == "bfloat16":
        x_in, w_in = [(a.view(np.uint32) >> 16).astype(np.uint16) for a in (x32, w32)]
        x32, w32 = [(a.astype(np.uint32) << 16).view(np.float32) for a in (x_in, w_in)]
    else:
        x_in, w_in = x32, w32
    return x_in.tobytes(), w_in.tobytes(), x32.astype(np.float64) @ w32.astype(np.float64).T


def _run(exe, tmp, m, n, k, alpha, tiles, dtype="float32", threads=256, grid_x=None):  # type: ignore[no-untyped-def]
    ints, grid, shared = launch_shape(m, n, k, alpha, tiles, dtype)
    assert shared <= MAX_SHARED
    x, w, want = _inputs(m, n, k, dtype)
    (tmp / "x").write_bytes(x)
    (tmp / "w").write_bytes(w)
    args = [*ints, threads, grid_x or grid[0]]
    subprocess.run([str(exe), *map(str, args), str(tmp / "x"), str(tmp / "w"), str(tmp / "o")],
                   check=True, timeout=120)  # fmt: skip
    return np.fromfile(tmp / "o", np.float32).reshape(m, n), want


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("shape", [(33, 70, 45), (100, 37, 19), (1, 64, 128)])
def test_the_gpu_kernel_equals_numpy_for_every_split(host_kernel, tmp_path, shape, alpha):
    tiles = Tiles(bm=16, bn=16, bk=32, wbm=24, wbn=8, wbk=16)
    got, want = _run(host_kernel, tmp_path, *shape, alpha, tiles)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_inputs_accumulate_in_fp32(host_kernel, tmp_path, dtype):
    tiles = Tiles(bm=16, bn=32, bk=16, wbm=16, wbn=32, wbk=32)
    got, want = _run(host_kernel, tmp_path, 20, 96, 40, 0.5, tiles, dtype)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_one_block_takes_every_tile_in_turn(host_kernel, tmp_path):
    tiles = Tiles(bm=8, bn=8, bk=8, wbm=8, wbn=8, wbk=8)
    got, want = _run(host_kernel, tmp_path, 21, 30, 17, 0.5, tiles, threads=64, grid_x=1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads,bm", [(8, 20), (4, 100)])
def test_tiles_larger_than_the_registers_are_swept_in_parts(host_kernel, tmp_path, threads, bm):
    # 16 accumulators per thread: 8 threads hold 128 outputs (a 20 x 24 tile in column parts),
    # 4 threads hold 64 (100 rows also in row parts)
    tiles = Tiles(bm=bm, bn=24, bk=8, wbm=16, wbn=8, wbk=8)
    got, want = _run(host_kernel, tmp_path, 100, 30, 13, 0.6, tiles, threads=threads)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
