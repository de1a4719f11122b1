// mblas on a GPU: the same host API as csrc/kernels/cpu/mblas.c. The kernel has internal linkage
// (like cuBLAS's, no host symbol names it); with lazy loading its module appears at first use.
#include <cuda_runtime_api.h>

namespace mblas {
namespace {
constexpr int TILE = 16;

__global__ void sgemm_rm_f32(int transa, int transb, int m, int n, int k, float alpha,
                             const float *a, int lda, const float *b, int ldb, float beta, float *c,
                             int ldc) {
    __shared__ float as[TILE][TILE + 1], bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TILE) {
        int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        as[threadIdx.y][threadIdx.x] =
            row < m && ka < k ? (transa ? a[(size_t)ka * lda + row] : a[(size_t)row * lda + ka]) : 0.0f;
        bs[threadIdx.y][threadIdx.x] =
            kb < k && col < n ? (transb ? b[(size_t)col * ldb + kb] : b[(size_t)kb * ldb + col]) : 0.0f;
        __syncthreads();
        for (int i = 0; i < TILE; i++)
            acc += as[threadIdx.y][i] * bs[i][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) {
        float *out = c + (size_t)row * ldc + col;
        *out = alpha * acc + (beta != 0.0f ? beta * *out : 0.0f);
    }
}
}  // namespace
}  // namespace mblas

extern "C" __attribute__((visibility("default"))) int mblas_sgemm(
    int transa, int transb, int m, int n, int k, float alpha, const float *a, int lda,
    const float *b, int ldb, float beta, float *c, int ldc, cudaStream_t stream) {
    dim3 block(mblas::TILE, mblas::TILE), grid((n + mblas::TILE - 1) / mblas::TILE,
                                                (m + mblas::TILE - 1) / mblas::TILE);
    mblas::sgemm_rm_f32<<<grid, block, 0, stream>>>(transa, transb, m, n, k, alpha, a, lda, b, ldb,
                                                    beta, c, ldc);
    return (int)cudaGetLastError();
}

extern "C" __attribute__((visibility("default"))) int mblas_backend(void) { return 3; }
