"""GPU check of the PTX access instrumentation (`bash scripts/gpu/tessera_ptx.sh`): compiles a
kernel with known accesses (global; generic, to global or shared memory; a packed-half atomic)
to PTX, instruments it, runs it on the GPU through the driver API and compares the recorded
extents with the ones its arguments imply. Needs nvcc and a GPU; on this
project's CPU machines the instrumented PTX is only assembled (tests/tessera/test_ptx.py)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
from ctypes import byref, c_int, c_size_t, c_uint, c_uint64, c_void_p
from pathlib import Path
from typing import Any

from medusa.tessera.ptx import (
    BUFFER,
    READ,
    WRITE,
    Instrumented,
    extents,
    initial_records,
    instrument,
)

KERNEL = r"""
#include <cuda_fp16.h>
extern "C" __global__ void strided(float *out, const float *in, int n, int stride,
                                   unsigned int *hits, float *aux, __half2 *pairs) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = in[i * stride] * 2.0f;
        if (i % 2 == 0) atomicAdd(hits, 1u);
        float *p = i % 3 == 0 ? &tile[threadIdx.x] : aux + i;  // shared or global: generic
        *p = 1.0f;
        if (i < 64) atomicAdd(pairs + i, __floats2half2_rn(1.0f, 1.0f));  // generic f16x2
    }
}
"""
N, STRIDE, THREADS, PAIRS = 1000, 3, 256, 64  # PAIRS: the 64 of KERNEL


class Driver:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def __call__(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code:
            raise RuntimeError(f"{name} failed with CUresult {code}")


def compile_ptx(source: str, arch: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        cu, ptx = Path(tmp) / "k.cu", Path(tmp) / "k.ptx"
        cu.write_text(source)
        subprocess.run(["nvcc", "-ptx", f"-arch={arch}", str(cu), "-o", str(ptx)], check=True)
        return ptx.read_text()


def main() -> int:
    cu = Driver()
    inst, mod, fn = _load(cu)
    src_bytes = ((N - 1) * STRIDE + 1) * 4
    out, src, hits = _alloc(cu, N * 4), _alloc(cu, src_bytes + 4096), _alloc(cu, 4)
    aux, pairs = _alloc(cu, N * 4), _alloc(cu, PAIRS * 4)
    args = [c_uint64(out), c_uint64(src), c_int(N), c_int(STRIDE), c_uint64(hits),
            c_uint64(aux), c_uint64(pairs)]  # fmt: skip
    seen = _run_recorded(cu, inst, mod, fn, args)
    want = {
        (READ, src, src + src_bytes),  # in[0 .. (N-1)*STRIDE], threads >= N read nothing
        (WRITE, out, out + N * 4),
        (READ | WRITE, hits, hits + 4),  # the atomic, from even threads only
        (WRITE, aux + 4, aux + 999 * 4),  # generic: threads 1 .. 998 but every third (shared)
        (READ | WRITE, pairs, pairs + PAIRS * 4),  # a generic packed-half atomic
    }
    return _report(len(inst.sites), seen, want)


def _load(cu: Driver) -> tuple[Instrumented, c_void_p, c_void_p]:
    """KERNEL compiled for device 0, instrumented, loaded in its primary context."""
    cu("cuInit", 0)
    dev, ctx = c_int(), c_void_p()
    cu("cuDeviceGet", byref(dev), 0)
    major, minor = c_int(), c_int()
    cu("cuDeviceGetAttribute", byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
    cu("cuDeviceGetAttribute", byref(minor), 76, dev)
    cu("cuDevicePrimaryCtxRetain", byref(ctx), dev)
    cu("cuCtxSetCurrent", ctx)
    inst = instrument(compile_ptx(KERNEL, f"sm_{major.value}{minor.value}"))
    assert not inst.unsupported, inst.unsupported
    mod, fn = c_void_p(), c_void_p()
    cu("cuModuleLoadData", byref(mod), ctypes.c_char_p(inst.ptx.encode() + b"\0"))
    cu("cuModuleGetFunction", byref(fn), mod, b"strided")
    return inst, mod, fn


def _alloc(cu: Driver, nbytes: int) -> int:
    p = c_uint64()
    cu("cuMemAlloc_v2", byref(p), c_size_t(nbytes))
    return p.value


def _run_recorded(
    cu: Driver, inst: Instrumented, mod: c_void_p, fn: c_void_p, args: list[Any]
) -> set[tuple[int, int, int]]:
    """Launches the kernel with a fresh record buffer: the (mode, start, end) extents recorded."""
    records = initial_records(len(inst.sites))
    buf = _alloc(cu, len(records))
    cu("cuMemcpyHtoD_v2", c_uint64(buf), records, c_size_t(len(records)))
    sym, size = c_uint64(), c_size_t()
    cu("cuModuleGetGlobal_v2", byref(sym), byref(size), mod, BUFFER.encode())
    cu("cuMemcpyHtoD_v2", sym, byref(c_uint64(buf)), c_size_t(8))
    params = (c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
    blocks = (N + THREADS - 1) // THREADS
    cu("cuLaunchKernel", fn, c_uint(blocks), c_uint(1), c_uint(1), c_uint(THREADS), c_uint(1),
       c_uint(1), c_uint(0), None, params, None)  # fmt: skip
    cu("cuCtxSynchronize")
    got = ctypes.create_string_buffer(len(records))
    cu("cuMemcpyDtoH_v2", got, c_uint64(buf), c_size_t(len(records)))
    return {(s.mode, lo, hi) for s, lo, hi in extents(got.raw, inst.sites)}


def _report(sites: int, seen: set[tuple[int, int, int]], want: set[tuple[int, int, int]]) -> int:
    print(f"{sites} sites instrumented; recorded extents:")
    for mode, lo, hi in sorted(seen, key=lambda e: e[1]):
        print(f"  {'-RW'[mode] if mode < 3 else 'RW'} [{lo:#x}, {hi:#x}) {hi - lo} bytes")
    if seen != want:
        print(f"MISMATCH: expected {sorted(want)}", file=sys.stderr)
        return 1
    print("ok: the instrumented kernel recorded exactly the extents its arguments imply")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
