"""HybridGEMM's launch, which the engine owns (its projections run it when weights="host"): the
tiles, the split of the output columns by alpha, and the kernel's arguments, grid and shared
memory. The performance model and the alpha controller that read these are C2C's (medusa.c2c)."""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
MAX_SHARED = 48 * 1024  # a block's dynamic shared memory unless the kernel opts in to more


@dataclass(frozen=True)
class Tiles:
    bm: int = 64  # output-stationary tile (rows of O)
    bn: int = 64  # output-stationary tile (columns of O)
    bk: int = 64
    wbm: int = 64  # weight-stationary: the M step swept under a resident W tile
    wbn: int = 64
    wbk: int = 64


DEFAULT_TILES = Tiles()
# The engine's projections (decode: M is the batch).
HOST_TILES = Tiles(bm=16, bn=64, bk=64, wbm=64, wbn=64, wbk=128)  # 33,024 B shared memory


def split_columns(n: int, alpha: float) -> int:
    """Columns the output-stationary path takes: floor(alpha * N)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha}: must be in [0, 1]")
    return int(alpha * n)


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
