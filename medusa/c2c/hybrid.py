"""HybridGEMM on the CUDA ABI (the simcuda or CUDA kernel `hybrid_gemm_kernel`)."""

from __future__ import annotations

import ctypes

from medusa.c2c.model import DEFAULT_TILES, Tiles, split_columns
from medusa.cuda.backend import Backend

DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
MAX_SHARED = 48 * 1024  # a block's dynamic shared memory unless the kernel opts in to more


def shared_bytes(tiles: Tiles) -> int:
    """Dynamic shared memory of one block: the larger of the output-stationary X and W tiles
    (BM + BN rows of BK) and the resident weight-stationary W tile (WBN rows of WBK), fp32 rows
    at an odd pitch (csrc/kernels/cuda/hybridgemm.cu: no shared-memory bank conflicts)."""
    return 4 * max((tiles.bm + tiles.bn) * (tiles.bk | 1), tiles.wbn * (tiles.wbk | 1))


def launch_shape(
    m: int, n: int, k: int, alpha: float, tiles: Tiles, dtype: str = "float32"
) -> tuple[list[int], tuple[int, int], int]:
    """The kernel's integer arguments (after out, x, w), its grid (tiles of the larger path x
    the two paths) and its dynamic shared memory (shared_bytes)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: use one of {sorted(DTYPES)}")
    for name in ("bm", "bn", "bk", "wbm", "wbn", "wbk"):
        if getattr(tiles, name) < 1:
            raise ValueError(f"tiles.{name} must be positive")
    shared = shared_bytes(tiles)
    if shared > MAX_SHARED:  # NOTE: for any alpha, so that tuning alpha never starts failing
        raise ValueError(
            f"{tiles} needs {shared} bytes of shared memory per block, more than {MAX_SHARED}: "
            "make bk, wbk or bm + bn, wbn smaller"
        )
    split = split_columns(n, alpha)
    tiles_os = -(-m // tiles.bm) * -(-split // tiles.bn)
    tiles_ws = -(-(n - split) // tiles.wbn) * -(-k // tiles.wbk)
    ints = [
        m,
        n,
        k,
        split,
        DTYPES[dtype],
        tiles.bm,
        tiles.bn,
        tiles.bk,
        tiles.wbm,
        tiles.wbn,
        tiles.wbk,
    ]
    return ints, (max(tiles_os, tiles_ws, 1), 2), shared


def hybrid_gemm(
    b: Backend,
    out: int,
    x: int,
    w: int,
    m: int,
    n: int,
    k: int,
    alpha: float,
    tiles: Tiles = DEFAULT_TILES,
    dtype: str = "float32",
    stream: int = 0,
) -> None:
    """out[m, n] (fp32) = x[m, k] . w^T, w stored [n, k] (host-mapped on a superchip)."""
    ints, grid, shared = launch_shape(m, n, k, alpha, tiles, dtype)
    if ints[3] < n:  # NOTE: the weight-stationary columns accumulate: they must start at zero
        b.call("cudaMemsetAsync", ctypes.c_void_p(out), ctypes.c_int(0),
               ctypes.c_size_t(m * n * 4), ctypes.c_void_p(stream))  # fmt: skip
    args = [out, x, w] + [ctypes.c_int(v) for v in ints]
    b.launch("hybrid_gemm_kernel", (*grid, 1), 256, args, stream=stream, shared_mem=shared)
