"""HybridGEMM on a GPU (run by scripts/gpu/hybridgemm_bandwidth.sh): the kernel over pinned,
device-mapped host weights at alpha 0, 0.5 and 1, each with its error against an fp32 reference,
next to the two figures it lies between, measured in the same run on the same weight bytes:
cudaMemcpy from pinned host memory to the device (the host-to-device floor) and cuBLAS
(torch.matmul) on device-resident weights. Bandwidth is weight bytes / seconds, best of REPS.
Exit 1 if an error exceeds TOLERANCE (relative to the largest output)."""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from medusa.c2c.hybrid import hybrid_gemm
from medusa.cuda import load_backend
from medusa.engine.hybrid_gemm import Tiles

M, N, K = 64, 8192, 4096  # a decode batch of 64 through an 8192 x 4096 fp16 projection
TILES = Tiles(bm=64, bn=64, bk=64, wbm=64, wbn=32, wbk=64)
REPS = 5
TOLERANCE = 1e-3
H2D, MAPPED = 1, 2  # cudaMemcpyHostToDevice, cudaHostAllocMapped


def best(run: Callable[[], object]) -> float:
    """The shortest of REPS runs, in seconds, the device idle before and after each."""
    times = []
    for _ in range(REPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def show(name: str, seconds: float, nbytes: int, note: str = "") -> None:
    gbs = nbytes / seconds / 1e9
    print(f"{name}: {seconds * 1e3:8.3f} ms, weight bandwidth {gbs:7.1f} GB/s{note}")


def main() -> int:
    b = load_backend("cuda")
    b.load_kernels("medusa_kernels")
    nbytes = N * K * 2
    w_host = ctypes.c_void_p()
    b.call("cudaHostAlloc", ctypes.byref(w_host), ctypes.c_size_t(nbytes), ctypes.c_uint(MAPPED))
    w_np = np.frombuffer((ctypes.c_char * nbytes).from_address(w_host.value), np.float16)
    w_np[:] = np.random.default_rng(0).standard_normal(N * K).astype(np.float16)
    w_mapped = ctypes.c_void_p()
    b.call("cudaHostGetDevicePointer", ctypes.byref(w_mapped), w_host, ctypes.c_uint(0))
    w_dev = torch.empty(N, K, device="cuda", dtype=torch.float16)
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    o = torch.empty(M, N, device="cuda", dtype=torch.float32)

    def copy() -> None:
        b.call("cudaMemcpy", ctypes.c_void_p(w_dev.data_ptr()), w_host, ctypes.c_size_t(nbytes),
               ctypes.c_int(H2D))  # fmt: skip

    show("cudaMemcpy pinned host -> device, same bytes", best(copy), nbytes, " (the floor)")
    ref = x.float() @ w_dev.float().T  # fp32 reference from the copied weights
    scale = ref.abs().max().item()
    failed = False
    for alpha in (0.0, 0.5, 1.0):

        def run(alpha: float = alpha) -> None:
            hybrid_gemm(b, o.data_ptr(), x.data_ptr(), w_mapped.value, M, N, K, alpha, TILES,
                        dtype="float16")  # fmt: skip

        seconds = best(run)
        err = (o - ref).abs().max().item() / scale
        failed |= not err <= TOLERANCE
        show(f"alpha {alpha:.2f}", seconds, nbytes, f", max error {err:.2e} of max |O|")
    seconds = best(lambda: torch.matmul(x, w_dev.T))
    err = (torch.matmul(x, w_dev.T).float() - ref).abs().max().item() / scale
    show("cuBLAS, device weights", seconds, nbytes, f", max error {err:.2e} of max |O| (fp16 out)")
    print(f"shape M {M} N {N} K {K} fp16, {TILES}, {torch.cuda.get_device_name()}")
    if failed:
        print(f"FAIL: a HybridGEMM error exceeds {TOLERANCE:g} of max |O|", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
