/* Stream-capture rules: fork/join through events, unjoined work, legacy-stream implicit sync,
 * cudaMalloc in global vs relaxed mode, PDL edges, per-thread default stream capture. */
#include "common.h"

extern void scale_inplace(void);
static float *buf;
static int n = 16;
static float s2 = 2.0f;

static cudaError_t scale(cudaStream_t st) {
    void *args[] = {&buf, &s2, &n};
    return cudaLaunchKernel((const void *)scale_inplace, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args, 0, st);
}

int main(void) {
    CHECK(cudaMalloc((void **)&buf, 64));
    cudaStream_t a, b;
    cudaEvent_t fork, join;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&fork));
    CHECK(cudaEventCreate(&join));
    cudaGraph_t g;
    /* fork a -> b, work on both, join back: 3 nodes, 2 edges */
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    CHECK(scale(a));
    CHECK(cudaEventRecord(fork, a));
    CHECK(cudaStreamWaitEvent(b, fork, 0));
    CHECK(scale(b));
    CHECK(cudaEventRecord(join, b));
    CHECK(cudaStreamWaitEvent(a, join, 0));
    CHECK(scale(a));
    CHECK(cudaStreamEndCapture(a, &g));
    size_t nodes = 0, edges = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &nodes));
    CHECK(cudaGraphGetEdges(g, NULL, NULL, NULL, &edges));
    printf("forkjoin nodes=%zu edges=%zu\n", nodes, edges);
    /* forgetting the join */
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    CHECK(cudaEventRecord(fork, a));
    CHECK(cudaStreamWaitEvent(b, fork, 0));
    CHECK(scale(b));
    SHOW("unjoined", cudaStreamEndCapture(a, &g));
    /* a legacy-stream launch while a blocking stream captures */
    cudaStream_t blocking;
    CHECK(cudaStreamCreate(&blocking));
    CHECK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal));
    SHOW("legacy launch", scale(0));
    SHOW("end after implicit", cudaStreamEndCapture(blocking, &g));
    /* cudaMalloc during a global capture vs a relaxed one */
    void *p;
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    SHOW("malloc global", cudaMalloc(&p, 64));
    SHOW("end global", cudaStreamEndCapture(a, &g));
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeRelaxed));
    SHOW("malloc relaxed", cudaMalloc(&p, 64));
    SHOW("end relaxed", cudaStreamEndCapture(a, &g));
    /* programmatic dependent launch gives a programmatic edge */
    CHECK(cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal));
    CHECK(scale(a));
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {{1, 1, 1}, {32, 1, 1}, 0, a, &attr, 1};
    void *args[] = {&buf, &s2, &n};
    CHECK(cudaLaunchKernelExC(&cfg, (const void *)scale_inplace, args));
    CHECK(cudaStreamEndCapture(a, &g));
    cudaGraphNode_t from, to;
    cudaGraphEdgeData ed;
    edges = 1;
    CHECK(cudaGraphGetEdges(g, &from, &to, &ed, &edges));
    printf("pdl edge type=%d from_port=%d\n", ed.type, ed.from_port);
    edges = 1;
    SHOW("edges without data", cudaGraphGetEdges(g, &from, &to, NULL, &edges));
    /* the per-thread default stream can be captured; the legacy one cannot */
    SHOW("capture legacy", cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal));
    SHOW("capture per-thread", cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeGlobal));
    CHECK(scale(cudaStreamPerThread));
    SHOW("end per-thread", cudaStreamEndCapture(cudaStreamPerThread, &g));
    return 0;
}
