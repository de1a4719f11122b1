/* Copy and fill parameters as cuda.h asks them: a copy node's pitches cover its row
 * (WidthInBytes + XInBytes) even for one row, where a pitch 0 is accepted (the driver ignores it
 * there), a 2-D fill's pitch covers its row; a captured copy's parameters, read back, are
 * accepted again as they are; a captured 2-D fill keeps its pitch and leaves the bytes between
 * its rows. */
#include "common.h"

enum { N = 256, PITCH = 64, WIDTH = 40, ROWS = 3 };

static void node_params(unsigned char *a, unsigned char *b) {
    CUcontext ctx;
    CUgraph g;
    CUgraphNode n;
    CHECK(cuCtxGetCurrent(&ctx));
    CHECK(cuGraphCreate(&g, 0));
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = (CUdeviceptr)a, c.dstDevice = (CUdeviceptr)b;
    c.WidthInBytes = N, c.Height = c.Depth = 1;
    SHOW("copy node, pitch 0", cuGraphAddMemcpyNode(&n, g, NULL, 0, &c, ctx));
    c.srcPitch = c.dstPitch = N / 2;
    SHOW("copy node, pitch below its row", cuGraphAddMemcpyNode(&n, g, NULL, 0, &c, ctx));
    c.srcPitch = c.dstPitch = N, c.srcHeight = c.dstHeight = 1;
    SHOW("copy node, pitch of its row", cuGraphAddMemcpyNode(&n, g, NULL, 0, &c, ctx));
    CUDA_MEMSET_NODE_PARAMS m = {(CUdeviceptr)a, WIDTH - 1, 7, 1, WIDTH, ROWS};
    SHOW("fill node, pitch below its row", cuGraphAddMemsetNode(&n, g, NULL, 0, &m, ctx));
    m.pitch = PITCH;
    SHOW("fill node, pitch above its row", cuGraphAddMemsetNode(&n, g, NULL, 0, &m, ctx));
    CHECK(cuGraphDestroy(g));
    SHOW("cudaMemset2D, pitch below its row", cudaMemset2D(a, WIDTH - 1, 0x11, WIDTH, ROWS));
}

/* Captures a copy and a pitched fill, adds the copy's parameters read back to a new graph, and
 * replays the capture. */
static void captured(unsigned char *a, unsigned char *b) {
    cudaStream_t s;
    cudaGraph_t g;
    CUgraph again;
    CUgraphNode nodes[4], n;
    CUcontext ctx;
    size_t num = 4;
    CHECK(cuCtxGetCurrent(&ctx));
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaMemset2DAsync(a, PITCH, 0x11, WIDTH, ROWS, s));
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cuGraphGetNodes((CUgraph)g, nodes, &num));
    CHECK(cuGraphCreate(&again, 0));
    for (size_t i = 0; i < num; i++) {
        CUgraphNodeType t;
        CHECK(cuGraphNodeGetType(nodes[i], &t));
        if (t == CU_GRAPH_NODE_TYPE_MEMCPY) {
            CUDA_MEMCPY3D c;
            CHECK(cuGraphMemcpyNodeGetParams(nodes[i], &c));
            SHOW("captured copy, added again", cuGraphAddMemcpyNode(&n, again, NULL, 0, &c, ctx));
        } else if (t == CU_GRAPH_NODE_TYPE_MEMSET) {
            CUDA_MEMSET_NODE_PARAMS m;
            CHECK(cuGraphMemsetNodeGetParams(nodes[i], &m));
            printf("captured fill: pitch %zu rows %zu\n", m.pitch, m.height);
        }
    }
    CHECK(cuGraphDestroy(again));
    cudaGraphExec_t x;
    unsigned char host[PITCH * ROWS];
    CHECK(cudaGraphInstantiate(&x, g, 0));
    CHECK(cudaMemset(a, 0xAB, N));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(host, a, sizeof host, cudaMemcpyDeviceToHost));
    int filled = 0, kept = 0;
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < PITCH; i++)
            (i < WIDTH ? &filled : &kept)[0] += host[r * PITCH + i] == (i < WIDTH ? 0x11 : 0xAB);
    printf("fill replayed: %d of %d row bytes, %d of %d gap bytes kept\n", filled, ROWS * WIDTH, kept,
           ROWS * (PITCH - WIDTH));
    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphDestroy(g));
}

int main(void) {
    unsigned char *a, *b;
    CHECK(cudaMalloc((void **)&a, N));
    CHECK(cudaMalloc((void **)&b, N));
    node_params(a, b);
    captured(a, b);
    return 0;
}
