"""HybridGEMM in Triton: the contract of the simcuda and CUDA kernels, Out[M, N] (fp32) = X . W^T
with W stored [N, K] (host-resident on a superchip). Columns [0, split) run output-stationary,
columns [split, N) weight-stationary with fp32 atomic adds into Out. fp16/bf16 inputs are widened
to fp32 before the dot (accumulation in fp32). On a CPU, run under TRITON_INTERPRET=1."""

from __future__ import annotations

try:
    import torch
    import triton
    import triton.language as tl
except ImportError as e:  # the c2c extra
    raise ImportError(
        f"HybridGEMM in Triton needs torch and triton ({e}): pip install 'medusa-coldstart[c2c]'"
    ) from None

from medusa.engine.hybrid_gemm import DEFAULT_TILES, Tiles, split_columns


@triton.jit
def _output_stationary(  # type: ignore[no-untyped-def]  # NOTE: Triton types the arguments
    X,
    W,
    Out,
    M,
    K,
    split,
    stride_x,
    stride_w,
    stride_o,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        x = tl.load(
            X + rm[:, None] * stride_x + kk[None, :],
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        w = tl.load(
            W + rn[None, :] * stride_w + kk[:, None],
            mask=(rn[None, :] < split) & (kk[:, None] < K),
            other=0.0,
        ).to(tl.float32)
        acc += tl.dot(x, w, input_precision="ieee")
    tl.store(
        Out + rm[:, None] * stride_o + rn[None, :],
        acc,
        mask=(rm[:, None] < M) & (rn[None, :] < split),
    )


@triton.jit
def _weight_stationary(  # type: ignore[no-untyped-def]  # NOTE: Triton types the arguments
    X,
    W,
    Out,
    M,
    N,
    K,
    split,
    stride_x,
    stride_w,
    stride_o,
    WBM: tl.constexpr,
    WBN: tl.constexpr,
    WBK: tl.constexpr,
):
    rn = split + tl.program_id(0) * WBN + tl.arange(0, WBN)
    rk = tl.program_id(1) * WBK + tl.arange(0, WBK)
    # The W tile is loaded once and stays on chip while M is swept.
    w = tl.load(
        W + rn[None, :] * stride_w + rk[:, None],
        mask=(rn[None, :] < N) & (rk[:, None] < K),
        other=0.0,
    ).to(tl.float32)
    for m0 in range(0, M, WBM):
        rm = m0 + tl.arange(0, WBM)
        x = tl.load(
            X + rm[:, None] * stride_x + rk[None, :],
            mask=(rm[:, None] < M) & (rk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        part = tl.dot(x, w, input_precision="ieee")
        tl.atomic_add(
            Out + rm[:, None] * stride_o + rn[None, :],
            part,
            mask=(rm[:, None] < M) & (rn[None, :] < N),
        )


def hybrid_gemm_triton(
    x: torch.Tensor, w: torch.Tensor, alpha: float, tiles: Tiles = DEFAULT_TILES
) -> torch.Tensor:
    """x [M, K], w [N, K] (fp32, fp16 or bf16) -> Out [M, N] fp32. Tiles must be >= 16 (tl.dot)."""
    m, k = x.shape
    n, k2 = w.shape
    if k != k2:
        raise ValueError(f"x is [{m}, {k}] and w is [{n}, {k2}]: K differs")
    if min(tiles.bm, tiles.bn, tiles.bk, tiles.wbm, tiles.wbn, tiles.wbk) < 16:
        raise ValueError(f"{tiles}: Triton's dot needs tiles of at least 16")
    x, w = x.contiguous(), w.contiguous()
    split = split_columns(n, alpha)
    o = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    if split:
        grid = (triton.cdiv(m, tiles.bm), triton.cdiv(split, tiles.bn))
        _output_stationary[grid](
            x,
            w,
            o,
            m,
            k,
            split,
            x.stride(0),
            w.stride(0),
            o.stride(0),
            BM=tiles.bm,
            BN=tiles.bn,
            BK=tiles.bk,
        )
    if split < n:
        grid = (triton.cdiv(n - split, tiles.wbn), triton.cdiv(k, tiles.wbk))
        _weight_stationary[grid](
            x,
            w,
            o,
            m,
            n,
            k,
            split,
            x.stride(0),
            w.stride(0),
            o.stride(0),
            WBM=tiles.wbm,
            WBN=tiles.wbn,
            WBK=tiles.wbk,
        )
    return o
