// HybridGEMM for a GPU: the contract of csrc/kernels/cpu/hybridgemm.c. O[M,N] (fp32) = X . W^T,
// W stored [N,K] in host-mapped memory (read over NVLink-C2C on a superchip), X in HBM. Blocks
// with blockIdx.y == 0 take output-stationary tiles of columns [0, split); blocks with
// blockIdx.y == 1 take weight-stationary W tiles of columns [split, N), keep them in shared
// memory, sweep M and accumulate into O with atomicAdd (O's columns [split, N) must be zero).
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define KERNEL extern "C" __global__ __attribute__((visibility("default")))

static __device__ float load(const void *base, int dtype, size_t i) {
    if (dtype == 0)
        return static_cast<const float *>(base)[i];
    if (dtype == 1)
        return __half2float(static_cast<const __half *>(base)[i]);
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
}

static __device__ void output_stationary(float *o, const void *x, const void *w, int m, int n,
                                         int k, int split, int dtype, int bm, int bn, int bk,
                                         int tile) {
    int tiles_n = (split + bn - 1) / bn, tm = tile / tiles_n, tn = tile % tiles_n;
    int m0 = tm * bm, n0 = tn * bn;
    for (int e = threadIdx.x; e < bm * bn; e += blockDim.x) {
        int i = m0 + e / bn, j = n0 + e % bn;
        if (i >= m || j >= split)
            continue;
        float acc = 0.0f;
        for (int l = 0; l < k; l++)
            acc += load(x, dtype, (size_t)i * k + l) * load(w, dtype, (size_t)j * k + l);
        o[(size_t)i * n + j] = acc;
    }
    (void)bk;
}

static __device__ void weight_stationary(float *o, const void *x, const void *w, int m, int n,
                                         int k, int split, int dtype, int wbm, int wbn, int wbk,
                                         int tile) {
    extern __shared__ float wt[];  // wbn x wbk floats
    int tiles_k = (k + wbk - 1) / wbk, tn = tile / tiles_k, tk = tile % tiles_k;
    int n0 = split + tn * wbn, k0 = tk * wbk;
    for (int e = threadIdx.x; e < wbn * wbk; e += blockDim.x) {
        int j = n0 + e / wbk, l = k0 + e % wbk;
        wt[e] = j < n && l < k ? load(w, dtype, (size_t)j * k + l) : 0.0f;
    }
    __syncthreads();
    for (int m0 = 0; m0 < m; m0 += wbm)
        for (int e = threadIdx.x; e < wbm * wbn; e += blockDim.x) {
            int i = m0 + e / wbn, jj = e % wbn;
            if (i >= m || n0 + jj >= n)
                continue;
            float s = 0.0f;
            for (int l = 0; l < wbk && k0 + l < k; l++)
                s += load(x, dtype, (size_t)i * k + k0 + l) * wt[jj * wbk + l];
            atomicAdd(&o[(size_t)i * n + n0 + jj], s);
        }
}

// grid: x covers the larger of the two tile counts, y = 2 (path). Dynamic shared memory:
// wbn * wbk * 4 bytes.
KERNEL void hybrid_gemm_kernel(float *o, const void *x, const void *w, int m, int n, int k,
                               int split, int dtype, int bm, int bn, int bk, int wbm, int wbn,
                               int wbk) {
    if (blockIdx.y == 0) {
        int count = ((m + bm - 1) / bm) * ((split + bn - 1) / bn);
        for (int t = blockIdx.x; t < count; t += gridDim.x)
            output_stationary(o, x, w, m, n, k, split, dtype, bm, bn, bk, t);
    } else {
        int count = ((n - split + wbn - 1) / wbn) * ((k + wbk - 1) / wbk);
        for (int t = blockIdx.x; t < count; t += gridDim.x) {
            weight_stationary(o, x, w, m, n, k, split, dtype, wbm, wbn, wbk, t);
            __syncthreads();
        }
    }
}
