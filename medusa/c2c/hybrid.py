"""HybridGEMM on the CUDA ABI (the simcuda or CUDA kernel `hybrid_gemm_kernel`), launched on its own
(the engine's projections launch it through medusa.engine.device, with the same shape)."""

from __future__ import annotations

import ctypes

from medusa.cuda.backend import Backend
from medusa.engine.hybrid_gemm import DEFAULT_TILES, Tiles, launch_shape


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
