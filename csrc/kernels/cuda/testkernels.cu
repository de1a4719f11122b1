// The GPU twin of csrc/kernels/cpu/testkernels.c: same names and parameters, so the same C test
// programs run against the real runtime (scripts/gpu/simcuda_parity.sh).
// NOTE: nvcc 13 hides __global__ host stubs by default; the engine finds kernels by name (dlsym).
#define KERNEL extern "C" __global__ __attribute__((visibility("default")))
#include <cuda_runtime.h>

struct axpy_params { float *y; const float *x; float alpha; int n; };

KERNEL void vector_add(float *out, const float *a, const float *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

KERNEL void scale_inplace(float *x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

KERNEL void axpy_struct(axpy_params p) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x)
        p.y[i] += p.alpha * p.x[i];
}

KERNEL void gather_ptrs(float *out, float *const *ptrs, int count, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = 0;
        for (int k = 0; k < count; k++) s += ptrs[k][i];
        out[i] = s;
    }
}

__device__ float bias = 1.5f;

KERNEL void add_global_bias(float *x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] += bias;
}

KERNEL void reverse_smem_kernel(float *x, int n) {
    extern __shared__ float tmp[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) tmp[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = tmp[n - 1 - i];
}

KERNEL void noop_kernel(float *x, int n) { (void)x; (void)n; }
