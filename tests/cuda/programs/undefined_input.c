/* Input the real runtime leaves undefined gets an error from simcuda, no crash: garbage stream and
 * graph handles (the real runtime may dereference them and crash), a copy from freed memory and
 * one past an allocation's end (on a GPU: whatever the freed range or the bytes after it hold now,
 * or a fault that poisons the context), and copies to or from the null page (what cudaMalloc(0)
 * hands out; on a GPU an error or a fault). Not a parity program (scripts/gpu/simcuda_parity.sh):
 * only simcuda's answer is defined, and checked. */
#include "common.h"

int main(void) {
    CHECK(cudaFree(0));
    SHOW("bad stream", cudaStreamSynchronize((cudaStream_t)0x1234));
    SHOW("bad graph launch", cudaGraphLaunch((cudaGraphExec_t)0x5678, 0));
    float *x, *q, h[4];
    CHECK(cudaMalloc((void **)&x, 4096)); /* before q is freed, so q's range is not handed out again */
    CHECK(cudaMalloc((void **)&q, 256));
    CHECK(cudaFree(q));
    SHOW("copy from freed", cudaMemcpy(h, q, 16, cudaMemcpyDeviceToHost));
    SHOW("copy past end", cudaMemcpy(h, x + 1023, 16, cudaMemcpyDeviceToHost));
    void *none;
    CHECK(cudaMalloc(&none, 0));
    SHOW("copy to null", cudaMemcpy(none, h, 16, cudaMemcpyHostToDevice));
    SHOW("copy from null", cudaMemcpy(h, none, 16, cudaMemcpyDeviceToHost));
    SHOW("fill null", cudaMemset(none, 0, 16));
    return 0;
}
