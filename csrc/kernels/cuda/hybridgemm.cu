// HybridGEMM for a GPU: the contract of csrc/kernels/cpu/hybridgemm.c. O[M,N] (fp32) = X . W^T,
// W stored [N,K] in host-mapped memory (read over NVLink-C2C on a superchip), X in HBM. Blocks
// with blockIdx.y == 0 take output-stationary BM x BN tiles of columns [0, split), K swept in BK
// steps; blocks with blockIdx.y == 1 take weight-stationary WBN x WBK tiles of W for columns
// [split, N), keep them in shared memory, sweep M and accumulate into O with atomicAdd (O's
// columns [split, N) must be zero).
// Every read of W is coalesced (consecutive threads read consecutive k of one row) and goes into
// shared memory once per tile, for all the rows of X the tile serves. Shared tiles have an odd
// row pitch, so threads reading one k of 32 different rows hit 32 different banks.
// Dynamic shared memory: the larger of (BM + BN) * (BK | 1) and WBN * (WBK | 1) floats
// (medusa/c2c/hybrid.py's shared_bytes).
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define KERNEL extern "C" __global__ __attribute__((visibility("default")))

// Output-stationary accumulators per thread, in registers: a block of T threads computes an
// output sub-tile of at most ACC * T elements per sweep of K.
constexpr int ACC = 16;

static __device__ float load(const void *base, int dtype, size_t i) {
    if (dtype == 0)
        return static_cast<const float *>(base)[i];
    if (dtype == 1)
        return __half2float(static_cast<const __half *>(base)[i]);
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
}

// Rows [r0, r0 + rows) x columns [k0, k0 + cols) of a row-major [*, k] matrix into dst, as fp32
// with row pitch `pitch`. Consecutive threads take consecutive columns: coalesced loads.
static __device__ void stage(float *dst, int pitch, const void *src, int dtype, int k, int r0,
                             int rows, int k0, int cols) {
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
        int r = e / cols, l = e % cols;
        dst[r * pitch + l] = load(src, dtype, (size_t)(r0 + r) * k + k0 + l);
    }
}

struct gemm {
    float *o;
    const void *x, *w;
    int m, n, k, split, dtype;
};

// O[i0 .. i0+rows, j0 .. j0+cols] = X[i0.., :] . W[j0.., :]^T, rows * cols <= ACC * blockDim.x.
// Each BK step stages X's and W's tiles (xs: up to bm rows, then ws), then every thread adds the
// step's dot products to its outputs. A warp's threads take consecutive outputs of a row: up to
// 32 consecutive ws rows at an odd pitch (32 banks), and one or a few xs rows (broadcasts).
static __device__ void os_subtile(const gemm &g, int bm, int bk, int i0, int rows, int j0,
                                  int cols, float *smem) {
    int pitch = bk | 1, count = rows * cols;
    float *xs = smem, *ws = smem + bm * pitch;
    float acc[ACC];
#pragma unroll
    for (int a = 0; a < ACC; a++)
        acc[a] = 0.0f;
    for (int k0 = 0; k0 < g.k; k0 += bk) {
        int kc = min(bk, g.k - k0);
        stage(xs, pitch, g.x, g.dtype, g.k, i0, rows, k0, kc);
        stage(ws, pitch, g.w, g.dtype, g.k, j0, cols, k0, kc);
        __syncthreads();
#pragma unroll
        for (int a = 0; a < ACC; a++) {
            int e = threadIdx.x + a * blockDim.x;
            if (e < count) {
                const float *xr = xs + (e / cols) * pitch, *wr = ws + (e % cols) * pitch;
                float s = 0.0f;
                for (int l = 0; l < kc; l++)
                    s += xr[l] * wr[l];
                acc[a] += s;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < ACC; a++) {
        int e = threadIdx.x + a * blockDim.x;
        if (e < count)
            g.o[(size_t)(i0 + e / cols) * g.n + j0 + e % cols] = acc[a];
    }
}

// One BM x BN output tile, in sub-tiles that fit the registers: all its rows and as many columns
// as fit, so W is still read once per tile (a tile of more than ACC * blockDim.x rows excepted).
static __device__ void output_stationary(const gemm &g, int bm, int bn, int bk, int tile,
                                         float *smem) {
    int tiles_n = (g.split + bn - 1) / bn, tm = tile / tiles_n, tn = tile % tiles_n;
    int m0 = tm * bm, n0 = tn * bn;
    int rows = min(bm, g.m - m0), cols = min(bn, g.split - n0), cap = ACC * (int)blockDim.x;
    int sr = min(rows, cap), sc = min(cols, max(1, cap / sr));
    for (int i = 0; i < rows; i += sr)
        for (int j = 0; j < cols; j += sc)
            os_subtile(g, bm, bk, m0 + i, min(sr, rows - i), n0 + j, min(sc, cols - j), smem);
}

// A WBN x WBK tile of W read once into shared memory, then M swept in WBM steps: each thread
// takes outputs (i, jj), consecutive jj across a warp (wt rows at an odd pitch: no bank conflict;
// X's row i is one address for the warp), and adds its partial dot product into O atomically.
static __device__ void weight_stationary(const gemm &g, int wbm, int wbn, int wbk, int tile,
                                         float *wt) {
    int pitch = wbk | 1;
    int tiles_k = (g.k + wbk - 1) / wbk, tn = tile / tiles_k, tk = tile % tiles_k;
    int n0 = g.split + tn * wbn, k0 = tk * wbk;
    int cols = min(wbn, g.n - n0), kc = min(wbk, g.k - k0);
    stage(wt, pitch, g.w, g.dtype, g.k, n0, cols, k0, kc);
    __syncthreads();
    for (int m0 = 0; m0 < g.m; m0 += wbm) {
        int rows = min(wbm, g.m - m0);
        for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
            int i = m0 + e / cols, jj = e % cols;
            const float *wr = wt + jj * pitch;
            size_t xi = (size_t)i * g.k + k0;
            float s = 0.0f;
            for (int l = 0; l < kc; l++)
                s += load(g.x, g.dtype, xi + l) * wr[l];
            atomicAdd(&g.o[(size_t)i * g.n + n0 + jj], s);
        }
    }
}

// grid: x covers the larger of the two tile counts, y = 2 (path); any block size.
KERNEL void hybrid_gemm_kernel(float *o, const void *x, const void *w, int m, int n, int k,
                               int split, int dtype, int bm, int bn, int bk, int wbm, int wbn,
                               int wbk) {
    extern __shared__ float smem[];
    const gemm g = {o, x, w, m, n, k, split, dtype};
    if (blockIdx.y == 0) {
        int count = ((m + bm - 1) / bm) * ((split + bn - 1) / bn);
        for (int t = blockIdx.x; t < count; t += gridDim.x)
            output_stationary(g, bm, bn, bk, t, smem);
    } else {
        int count = ((n - split + wbn - 1) / wbn) * ((k + wbk - 1) / wbk);
        for (int t = blockIdx.x; t < count; t += gridDim.x) {
            weight_stationary(g, wbm, wbn, wbk, t, smem);
            __syncthreads(); // the next tile overwrites wt
        }
    }
}
