/* What the recorder must see: an exact allocation/free sequence (runtime, driver, async, host, VMM),
 * launches, a captured graph with kernel, memset and memcpy nodes, instantiation and replay.
 * Prints every address it got, so a test can compare them with the trace, and a checksum of the
 * results, so a test can check the recorder changed nothing. */
#include "../../cuda/programs/common.h"

extern void vector_add(void);
extern void scale_inplace(void);

#define ADDR(label, p) printf("%s: %llu\n", label, (unsigned long long)(uintptr_t)(p))

int main(void) {
    float *a, *b, *c;
    CHECK(cudaMalloc((void **)&a, 4096));
    ADDR("a", a);
    CHECK(cudaMalloc((void **)&b, 4096));
    ADDR("b", b);
    CHECK(cudaFree(a));
    CHECK(cudaMalloc((void **)&c, 4096)); /* most likely a's old address: reuse */
    ADDR("c", c);
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, 1 << 20));
    ADDR("d", d);
    void *h;
    CHECK(cudaHostAlloc(&h, 8192, cudaHostAllocMapped));
    ADDR("h", h);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *e;
    CHECK(cudaMallocAsync(&e, 512, s));
    ADDR("e", e);
    CHECK(cudaFreeAsync(e, s));
    /* VMM: reserve, back, map, unmap, release */
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va;
    CUmemGenericAllocationHandle mh;
    CHECK(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
    ADDR("va", va);
    CHECK(cuMemCreate(&mh, gran, &prop, 0));
    CHECK(cuMemMap(va, gran, 0, mh, 0));
    CHECK(cuMemUnmap(va, gran));
    CHECK(cuMemRelease(mh));
    CHECK(cuMemAddressFree(va, 2 * gran));

    int n = 1024;
    float host[1024];
    for (int i = 0; i < n; i++)
        host[i] = (float)i;
    CHECK(cudaMemcpy(b, host, 4096, cudaMemcpyHostToDevice));
    void *add_args[] = {&c, &b, &b, &n};
    CHECK(cudaLaunchKernel((const void *)vector_add, (dim3){4, 1, 1}, (dim3){256, 1, 1}, add_args, 0, s));
    /* the graph: memset c, c = b + b, scale c by 3, copy c to a device scratch */
    cudaGraph_t g;
    float three = 3.0f;
    void *scale_args[] = {&c, &three, &n};
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(c, 0, 4096, s));
    CHECK(cudaLaunchKernel((const void *)vector_add, (dim3){4, 1, 1}, (dim3){256, 1, 1}, add_args, 0, s));
    CHECK(cudaLaunchKernel((const void *)scale_inplace, (dim3){4, 1, 1}, (dim3){256, 1, 1}, scale_args, 0, s));
    CHECK(cudaMemcpyAsync((void *)d, c, 4096, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaStreamEndCapture(s, &g));
    ADDR("graph", g);
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(host, (void *)d, 4096, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += host[i];
    printf("checksum: %.1f\n", sum);
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    CHECK(cuMemFree(d));
    CHECK(cudaFreeHost(h));
    return 0;
}
