"""HybridGEMM on simcuda: equals numpy for every split and ragged shapes, and the bytes it reads
from host-mapped and device memory are exactly what the performance model says."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from medusa.c2c.hybrid import hybrid_gemm
from medusa.c2c.model import gemm_traffic
from medusa.cuda import load_backend
from medusa.engine.hybrid_gemm import Tiles, launch_shape


@pytest.fixture(scope="module")
def sim():
    b = load_backend("sim")
    b.load_kernels("medusa_kernels")
    return b


def _host_mapped(b, data: bytes) -> int:
    p, d = ctypes.c_void_p(), ctypes.c_void_p()
    b.call("cudaHostAlloc", ctypes.byref(p), ctypes.c_size_t(len(data)), ctypes.c_uint(2))
    ctypes.memmove(p.value, data, len(data))
    b.call("cudaHostGetDevicePointer", ctypes.byref(d), p, ctypes.c_uint(0))
    return int(d.value)


def _traffic(b) -> list[int]:
    out = (ctypes.c_uint64 * 3)()
    b._fn("simcudaGetTraffic", None, [ctypes.c_void_p])(out)
    return list(out)


def _run(b, m, n, k, alpha, tiles, dtype):
    rng = np.random.default_rng(m * 1000 + n + k)
    x32 = rng.standard_normal((m, k)).astype(np.float32)
    w32 = rng.standard_normal((n, k)).astype(np.float32)
    if dtype == "float16":
        x_in, w_in = x32.astype(np.float16), w32.astype(np.float16)
        x32, w32 = x_in.astype(np.float32), w_in.astype(np.float32)
    elif dtype == "bfloat16":
        to_bf16 = lambda a: (a.view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
        x_in, w_in = to_bf16(x32), to_bf16(w32)
        x32 = (x_in.astype(np.uint32) << 16).view(np.float32)
        w32 = (w_in.astype(np.uint32) << 16).view(np.float32)
    else:
        x_in, w_in = x32, w32
    got, counted = _gemm(b, x_in, w_in, alpha, tiles, dtype)
    return got, x32 @ w32.T, counted


def _gemm(b, x_in, w_in, alpha, tiles, dtype="float32"):
    (m, k), n = x_in.shape, w_in.shape[0]
    x = b.malloc(x_in.nbytes)
    b.memcpy_htod(x, x_in.tobytes())
    w = _host_mapped(b, w_in.tobytes())
    o = b.malloc(m * n * 4)
    b._fn("simcudaResetTraffic", None, [])()
    hybrid_gemm(b, o, x, w, m, n, k, alpha, tiles, dtype)
    counted = _traffic(b)
    got = np.frombuffer(b.memcpy_dtoh(o, m * n * 4), np.float32).reshape(m, n)
    b.free(x)
    b.free(o)
    return got, counted


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("shape", [(33, 70, 45), (8, 64, 128), (100, 37, 19)])
def test_hybrid_gemm_equals_numpy_and_the_model_counts_its_bytes(sim, alpha, shape):
    m, n, k = shape
    tiles = Tiles(bm=16, bn=16, bk=32, wbm=24, wbn=8, wbk=16)
    got, want, counted = _run(sim, m, n, k, alpha, tiles, "float32")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # fp32: summation order only
    t = gemm_traffic(m, n, k, alpha, tiles, elem=4)
    assert counted[1] == t.c2c_read  # host-mapped bytes: W
    assert counted[0] == t.hbm_read  # device bytes: X, and O read by the atomic adds


def test_an_output_column_is_the_same_bits_wherever_its_weight_row_lies(sim):
    """Weight-stationary fp32 tiles run W's rows four at a time and the tile's last 1-3 rows one
    at a time: both must add up a row exactly alike (rows 0-3 and 4 of a 5-row tile, swapped)."""
    tiles = Tiles(bm=16, bn=16, bk=32, wbm=8, wbn=5, wbk=48)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 100)).astype(np.float32)
    w = rng.standard_normal((10, 100)).astype(np.float32)
    order = [4, 1, 2, 3, 0, 9, 6, 7, 8, 5]  # each tile's first row and its lone last row swap
    got, _ = _gemm(sim, x, w, 0.0, tiles)
    swapped, _ = _gemm(sim, x, w[order], 0.0, tiles)
    assert np.array_equal(swapped, got[:, order])


@pytest.mark.parametrize("dtype,tol", [("float16", 1e-3), ("bfloat16", 1e-3)])
def test_half_precision_inputs_accumulate_in_fp32(sim, dtype, tol):
    tiles = Tiles(bm=16, bn=16, bk=16, wbm=16, wbn=16, wbk=16)
    got, want, counted = _run(sim, 20, 48, 40, 0.5, tiles, dtype)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert counted[1] == gemm_traffic(20, 48, 40, 0.5, tiles, elem=2).c2c_read


def test_host_mapped_bytes_fall_as_alpha_falls(sim):
    tiles = Tiles(bm=8, bn=16, bk=16, wbm=64, wbn=16, wbk=16)
    c2c = [_run(sim, 64, 64, 32, a, tiles, "float32")[2][1] for a in (1.0, 0.5, 0.25, 0.0)]
    assert c2c == sorted(c2c, reverse=True) and c2c[0] > c2c[-1]
    assert c2c[-1] == 64 * 32 * 4  # weight-stationary: W crosses the link exactly once


def test_the_papers_shape_in_the_model():
    big = Tiles(bm=256, bn=256, bk=64, wbm=256, wbn=256, wbk=64)
    sym = gemm_traffic(10240, 16384, 4096, 1.0, big, elem=2).c2c_read
    asym = gemm_traffic(10240, 16384, 4096, 0.0, big, elem=2).c2c_read
    assert round(sym / 1e9, 2) == 5.37 and round(asym / 1e9, 2) == 0.13


def test_tiles_needing_more_shared_memory_than_a_block_has_are_refused():
    big = Tiles(bm=128, bn=128, bk=64, wbm=128, wbn=128, wbk=256)
    with pytest.raises(ValueError, match=r"needs 131584 bytes of shared memory per block, more "):
        launch_shape(8, 256, 256, 0.5, big)
