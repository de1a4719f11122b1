/* Built with -DCUDA_API_PER_THREAD_DEFAULT_STREAM (nvcc --default-stream per-thread): the runtime
 * calls are the _ptsz twins, and a capture of the per-thread stream works. Also a hidden-module
 * (cuBLAS-like) kernel, whose module appears only at first use. */
#include "../../cuda/programs/common.h"

extern void scale_inplace(void);
int testblas_sgemm(int m, int n, int k, const float *a, const float *b, float *c, cudaStream_t s);

int main(void) {
    float *buf, *c;
    CHECK(cudaMalloc((void **)&buf, 64));
    CHECK(cudaMalloc((void **)&c, 64));
    CHECK(cudaMemset(buf, 0, 64));
    float s = 2.0f;
    int n = 16;
    void *args[] = {&buf, &s, &n};
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaLaunchKernel((const void *)scale_inplace, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args, 0, 0));
    /* the library was built without per-thread streams: it is handed the per-thread stream */
    CHECK(testblas_sgemm(2, 2, 2, buf, buf, c, cudaStreamPerThread));
    CHECK(cudaStreamEndCapture(cudaStreamPerThread, &g));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &nodes));
    printf("nodes: %zu\n", nodes);
    return 0;
}
