"""The performance model: GH200 MIG slices, the shared NVLink-C2C link, and the exact traffic of
each HybridGEMM path as a function of shape, alpha and tiles (what the simcuda kernel counts)."""

from __future__ import annotations

from dataclasses import dataclass

from medusa.engine.hybrid_gemm import DEFAULT_TILES, Tiles, split_columns

C2C_BW = 450e9  # bytes/s per direction, shared by every slice of the superchip
GH200_PEAK_FLOPS = 989e12  # dense bf16, whole GPU (132 SMs)


@dataclass(frozen=True)
class SliceProfile:
    name: str
    memory: int  # bytes of HBM
    hbm_bw: float  # bytes/s
    sms: int

    @property
    def flops(self) -> float:
        return GH200_PEAK_FLOPS * self.sms / 132


GB = 1 << 30
GH200_MIG = {
    "1g.12gb": SliceProfile("1g.12gb", 12 * GB, 0.5e12, 16),
    "1g.24gb": SliceProfile("1g.24gb", 24 * GB, 1.0e12, 26),
    "2g.24gb": SliceProfile("2g.24gb", 24 * GB, 1.0e12, 32),
    "3g.48gb": SliceProfile("3g.48gb", 48 * GB, 2.0e12, 60),
    "4g.48gb": SliceProfile("4g.48gb", 48 * GB, 2.0e12, 64),
    "7g.96gb": SliceProfile("7g.96gb", 96 * GB, 4.0e12, 132),
}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Traffic:
    c2c_read: int  # bytes of W read over C2C (host-mapped)
    hbm_read: int  # bytes of X and of O (the weight-stationary atomics) read from HBM
    hbm_write: int  # bytes of O written (atomic adds write what they read)
    flops: int

    @property
    def hbm(self) -> int:
        return self.hbm_read + self.hbm_write


def gemm_traffic(
    m: int, n: int, k: int, alpha: float, tiles: Tiles = DEFAULT_TILES, elem: int = 2
) -> Traffic:
    """O[m, n] = X[m, k] . W^T with W [n, k] host-resident; elem: input bytes (2 for bf16)."""
    na = split_columns(n, alpha)
    nw = n - na
    os_w = k * na * elem * _cdiv(m, tiles.bm) if na else 0
    os_x = m * k * elem * _cdiv(na, tiles.bn) if na else 0
    ws_w = k * nw * elem
    ws_x = m * k * elem * _cdiv(nw, tiles.wbn) if nw else 0
    ws_o = m * nw * 4 * _cdiv(k, tiles.wbk) if nw else 0
    return Traffic(
        c2c_read=os_w + ws_w,
        hbm_read=os_x + ws_x + ws_o,
        hbm_write=m * na * 4 + ws_o,
        flops=2 * m * n * k,
    )


def gemm_time(t: Traffic, slice_: SliceProfile, c2c_share: float = C2C_BW) -> float:
    """Roofline: the slowest of C2C, HBM and compute."""
    return max(t.c2c_read / c2c_share, t.hbm / slice_.hbm_bw, t.flops / slice_.flops)


def utilisation(
    t: Traffic, slice_: SliceProfile, c2c_share: float, seconds: float
) -> tuple[float, float]:
    """(U_C2C, U_HBM) of this GEMM over `seconds`."""
    return t.c2c_read / (c2c_share * seconds), t.hbm / (slice_.hbm_bw * seconds)
