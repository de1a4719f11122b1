"""HybridGEMM on the CUDA ABI (the simcuda or CUDA kernel `hybrid_gemm_kernel`)."""

from __future__ import annotations

import ctypes

from medusa.c2c.model import DEFAULT_TILES, Tiles, split_columns
from medusa.cuda.backend import Backend

DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}


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
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: use one of {sorted(DTYPES)}")
    for name in ("bm", "bn", "bk", "wbm", "wbn", "wbk"):
        if getattr(tiles, name) < 1:
            raise ValueError(f"tiles.{name} must be positive")
    split = split_columns(n, alpha)
    args = [out, x, w] + [
        ctypes.c_int(v)
        for v in (
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
        )
    ]
    b.launch("hybrid_gemm_kernel", 1, 128, args, stream=stream)
