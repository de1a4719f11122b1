/* Bad pointers, sizes, handles and modes get the error the real library returns, no crash.
 * scripts/gpu/simcuda_parity.sh runs it on a GPU too, so every line here is one whose answer the
 * real runtime defines: garbage handles, a copy from freed memory or past an allocation's end
 * (undefined there: the real runtime may dereference a handle, a GPU may fault) are in
 * undefined_input.c, run on simcuda only. */
#include "common.h"

extern void reverse_smem_kernel(void);
extern void vector_add(void);

int main(void) {
    void *p = NULL, *q = NULL;
    size_t free_before, free_after, total;
    CHECK(cudaMemGetInfo(&free_before, &total));
    SHOW("huge malloc", cudaMalloc(&p, (size_t)1 << 50));
    SHOW("last error", cudaGetLastError());
    SHOW("last error again", cudaGetLastError());
    CHECK(cudaMemGetInfo(&free_after, &total));
    printf("arena intact: %d\n", free_before == free_after);
    float *x;
    CHECK(cudaMalloc((void **)&x, 4096));
    CHECK(cudaMalloc(&q, 256));
    SHOW("free interior", cudaFree((char *)q + 16));
    SHOW("double free", (cudaFree(q), cudaFree(q)));
    SHOW("unknown stub", cudaLaunchKernel((const void *)main, (dim3){1, 1, 1}, (dim3){1, 1, 1}, NULL, 0, 0));
    int n = 4;
    void *args[] = {&x, &n};
    SHOW("zero grid", cudaLaunchKernel((const void *)reverse_smem_kernel, (dim3){0, 1, 1}, (dim3){1, 1, 1}, args, 0, 0));
    SHOW("2048 threads", cudaLaunchKernel((const void *)reverse_smem_kernel, (dim3){1, 1, 1}, (dim3){2048, 1, 1}, args, 0, 0));
    SHOW("64K smem", cudaLaunchKernel((const void *)reverse_smem_kernel, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 65536, 0));
    CHECK(cudaFuncSetAttribute((const void *)reverse_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    SHOW("64K smem after attribute", cudaLaunchKernel((const void *)reverse_smem_kernel, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 65536, 0));
    float h[4];
    SHOW("bad kind", cudaMemcpy(h, x, 16, (enum cudaMemcpyKind)42));
    SHOW("end without begin", cudaStreamEndCapture(cudaStreamPerThread, (cudaGraph_t *)&p));
    SHOW("bad device", cudaSetDevice(3));
    cudaEvent_t e;
    CHECK(cudaEventCreate(&e));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaEventRecord(e, s));
    SHOW("sync captured event", cudaEventSynchronize(e));
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s, &g));
    return 0;
}
