/* Two streams and the race checker. argv[1] picks a case (a race fails the context for good):
 *   missing   a kernel on stream A writes x, a copy on stream B reads it without waiting
 *   ordered   the same, with an event recorded on A after the kernel and waited on by B
 *   neighbors two streams write neighbouring 256-byte blocks of one 4 KiB page
 *   graph     a graph whose two memset nodes write one buffer with no edge between them
 *   edge      the same graph with an edge
 *   legacy    a blocking stream's kernel, then cudaMemcpy on the legacy stream (ordered)
 *   nonblock  the same on a cudaStreamNonBlocking stream (not ordered)
 *   order     two streams write one buffer, unordered (which lands last is the schedule's)
 *   deferred  work runs later: what the host sees before and after a synchronization
 *   host      host functions and host nodes run in stream order, and may not call CUDA */
#include "common.h"
#include "simcuda/simcuda.h"

extern void scale_inplace(void);
extern void vector_add(void);

enum { N = 4096 };

static int scale(float *x, float f, int n, cudaStream_t s) {
    void *args[] = {&x, &f, &n};
    return cudaLaunchKernel((const void *)scale_inplace, (dim3){1, 1, 1}, (dim3){256, 1, 1}, args, 0, s);
}

static void fill(float *x, float v) {
    static float h[N];
    for (int i = 0; i < N; i++)
        h[i] = v;
    CHECK(cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice));
}

/* A kernel on a writes x (x *= 3); a copy on b reads it into pinned memory, after an event if
 * ordered. Prints the sum the host gets: 3 * N when the copy saw the kernel's result. */
static void two_streams(int ordered) {
    float *x, *host;
    cudaStream_t a, b;
    cudaEvent_t done;
    CHECK(cudaMalloc((void **)&x, N * 4));
    CHECK(cudaMallocHost((void **)&host, N * 4));
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    fill(x, 1.0f);
    CHECK(scale(x, 3.0f, N, a));
    if (ordered) {
        CHECK(cudaEventRecord(done, a));
        CHECK(cudaStreamWaitEvent(b, done, 0));
    }
    CHECK(cudaMemcpyAsync(host, x, N * 4, cudaMemcpyDeviceToHost, b));
    SHOW("sync", cudaStreamSynchronize(b));
    SHOW("device sync", cudaDeviceSynchronize());
    printf("message: %s\n", simcudaGetLastMessage());
    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += host[i];
    printf("sum: %.0f\n", sum);
}

static void neighbors(void) {
    float *p, *q;
    cudaStream_t a, b;
    CHECK(cudaMalloc((void **)&p, 256));
    CHECK(cudaMalloc((void **)&q, 256));
    printf("same page: %d\n", ((uintptr_t)p >> 12) == ((uintptr_t)q >> 12));
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CHECK(cudaMemsetAsync(p, 0, 256, a));
    CHECK(cudaMemsetAsync(q, 0, 256, b));
    CHECK(scale(p, 2.0f, 64, a));
    CHECK(scale(q, 2.0f, 64, b));
    SHOW("device sync", cudaDeviceSynchronize());
}

static void graph(int edge) {
    float *x;
    CHECK(cudaMalloc((void **)&x, N * 4));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    struct cudaMemsetParams m = {.dst = x, .value = 0, .elementSize = 4, .width = N, .height = 1};
    cudaGraphNode_t first, second;
    CHECK(cudaGraphAddMemsetNode(&first, g, NULL, 0, &m));
    m.value = 0x3f800000; /* 1.0f */
    CHECK(cudaGraphAddMemsetNode(&second, g, edge ? &first : NULL, edge ? 1 : 0, &m));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, 0));
    SHOW("device sync", cudaDeviceSynchronize());
    printf("message: %s\n", simcudaGetLastMessage());
}

static void legacy(unsigned flags) {
    float *x, h[N];
    cudaStream_t a;
    CHECK(cudaMalloc((void **)&x, N * 4));
    CHECK(cudaStreamCreateWithFlags(&a, flags));
    fill(x, 1.0f);
    CHECK(scale(x, 5.0f, N, a));
    SHOW("copy", cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost));
    printf("first: %.0f\n", h[0]);
    SHOW("device sync", cudaDeviceSynchronize());
}

/* Two streams write one buffer, unordered: the schedule decides which write lands last. */
static void order(void) {
    unsigned *x, h = 0;
    cudaStream_t a, b;
    CHECK(cudaMalloc((void **)&x, 4));
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CHECK(cudaMemsetAsync(x, 1, 4, a));
    CHECK(cudaMemsetAsync(x, 2, 4, b));
    SHOW("device sync", cudaDeviceSynchronize());
    if (cudaMemcpy(&h, x, 4, cudaMemcpyDeviceToHost) == cudaSuccess)
        printf("last: %u\n", h & 0xff);
}

static void deferred(void) {
    float *x, *host, src[N];
    cudaStream_t a;
    cudaEvent_t done;
    CHECK(cudaMalloc((void **)&x, N * 4));
    CHECK(cudaMallocHost((void **)&host, N * 4));
    CHECK(cudaStreamCreate(&a));
    CHECK(cudaEventCreate(&done));
    fill(x, 2.0f);
    for (int i = 0; i < N; i++)
        src[i] = 7.0f, host[i] = -1.0f;
    CHECK(cudaMemcpyAsync(x, src, N * 4, cudaMemcpyHostToDevice, a)); /* pageable: staged */
    src[0] = 100.0f;                                                   /* too late to matter */
    CHECK(cudaMemcpyAsync(host, x, N * 4, cudaMemcpyDeviceToHost, a)); /* pinned: queued */
    CHECK(cudaEventRecord(done, a));
    printf("before sync: %.0f\n", host[0]);
    SHOW("query", cudaEventQuery(done));
    SHOW("sync", cudaEventSynchronize(done));
    printf("after sync: %.0f\n", host[0]);
    SHOW("query after", cudaEventQuery(done));
}

static float g_seen = -1.0f;
static cudaError_t g_inner = cudaSuccess;

static void CUDART_CB seen(void *p) {
    g_seen = *(const float *)p;
    g_inner = cudaStreamQuery(0);
}

static void host(void) {
    float *x, *h;
    cudaStream_t s;
    CHECK(cudaMalloc((void **)&x, 4));
    CHECK(cudaMallocHost((void **)&h, 4));
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float two = 2.0f;
    CHECK(cudaMemcpy(x, &two, 4, cudaMemcpyHostToDevice));
    CHECK(scale(x, 3.0f, 1, s));
    CHECK(cudaMemcpyAsync(h, x, 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, seen, h));
    printf("seen before sync: %.0f\n", g_seen);
    CHECK(cudaStreamSynchronize(s));
    printf("seen: %.0f\n", g_seen);
    SHOW("cuda in a host function", g_inner);
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(scale(x, 3.0f, 1, s));
    CHECK(cudaMemcpyAsync(h, x, 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, seen, h));
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("seen in a graph: %.0f\n", g_seen);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "missing") || !strcmp(mode, "ordered"))
        two_streams(!strcmp(mode, "ordered"));
    else if (!strcmp(mode, "neighbors"))
        neighbors();
    else if (!strcmp(mode, "graph") || !strcmp(mode, "edge"))
        graph(!strcmp(mode, "edge"));
    else if (!strcmp(mode, "legacy") || !strcmp(mode, "nonblock"))
        legacy(!strcmp(mode, "legacy") ? cudaStreamDefault : cudaStreamNonBlocking);
    else if (!strcmp(mode, "order"))
        order();
    else if (!strcmp(mode, "deferred"))
        deferred();
    else if (!strcmp(mode, "host"))
        host();
    else
        return 2;
    return 0;
}
