#!/usr/bin/env bash
# HybridGEMM on a real GPU over pinned, device-mapped host weights, against cuBLAS (torch.matmul)
# on device-resident weights: effective weight bandwidth for alpha 0, 0.5, 1. On a GPU machine:
#   bash scripts/gpu/hybridgemm_bandwidth.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${MEDUSA_GPU_INSTALLED:-}" ] ||  # all.sh installed it already
  pip install -q . --config-settings=cmake.define.MEDUSA_BUILD_CUDA=ON
MEDUSA_DEVICE=cuda python - <<'PY'
import ctypes, time
import numpy as np
import torch
from medusa.c2c.model import Tiles, split_columns
from medusa.cuda import load_backend

b = load_backend("cuda")
b.load_kernels("medusa_kernels")
m, n, k = 64, 8192, 4096
tiles = Tiles(bm=64, bn=64, bk=64, wbm=64, wbn=32, wbk=64)
w_host = ctypes.c_void_p()
b.call("cudaHostAlloc", ctypes.byref(w_host), ctypes.c_size_t(n * k * 2), ctypes.c_uint(2))
w_np = np.frombuffer((ctypes.c_char * (n * k * 2)).from_address(w_host.value), np.float16)
w_np[:] = np.random.default_rng(0).standard_normal(n * k).astype(np.float16)
w_dev = ctypes.c_void_p()
b.call("cudaHostGetDevicePointer", ctypes.byref(w_dev), w_host, ctypes.c_uint(0))
x = torch.randn(m, k, device="cuda", dtype=torch.float16)
o = torch.zeros(m, n, device="cuda", dtype=torch.float32)
for alpha in (0.0, 0.5, 1.0):
    split = split_columns(n, alpha)
    tiles_os = -(-m // tiles.bm) * -(-split // tiles.bn)
    tiles_ws = -(-(n - split) // tiles.wbn) * -(-k // tiles.wbk)
    args = [o.data_ptr(), x.data_ptr(), w_dev.value] + [ctypes.c_int(v) for v in (
        m, n, k, split, 1, tiles.bm, tiles.bn, tiles.bk, tiles.wbm, tiles.wbn, tiles.wbk)]
    grid = (max(tiles_os, tiles_ws, 1), 2, 1)
    for rep in range(4):
        o.zero_(); torch.cuda.synchronize(); t0 = time.perf_counter()
        b.launch("hybrid_gemm_kernel", grid, 256, args, shared_mem=tiles.wbn * tiles.wbk * 4)
        torch.cuda.synchronize(); dt = time.perf_counter() - t0
    ref = x.float() @ torch.from_numpy(w_np.reshape(n, k)).cuda().float().T
    err = (o - ref).abs().max().item()
    print(f"alpha {alpha:.2f}: {dt * 1e3:8.3f} ms, weight bandwidth {n * k * 2 / dt / 1e9:7.1f} GB/s, max err {err:.3g}")
wd = torch.from_numpy(w_np.reshape(n, k)).cuda()
for rep in range(4):
    torch.cuda.synchronize(); t0 = time.perf_counter(); torch.matmul(x, wd.T); torch.cuda.synchronize()
    dt = time.perf_counter() - t0
print(f"cuBLAS, device weights: {dt * 1e3:8.3f} ms, weight bandwidth {n * k * 2 / dt / 1e9:7.1f} GB/s")
PY
