/* Event waits across a capture's boundary, as the driver rules them (no simcuda extension, so
 * scripts/gpu/simcuda_parity.sh runs it on a GPU too): cudaEventWaitExternal outside capture is
 * invalid (cuda.h; the driver answers cudaErrorIllegalState); a capturing stream may not wait on an event recorded outside the capture
 * (the programming guide), while an event never recorded is an empty wait. */
#include "common.h"

int main(void) {
    cudaStream_t s, other;
    cudaEvent_t outside, never;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamCreate(&other));
    CHECK(cudaEventCreate(&outside));
    CHECK(cudaEventCreate(&never));
    CHECK(cudaEventRecord(outside, other));
    SHOW("external outside capture", cudaStreamWaitEvent(s, outside, cudaEventWaitExternal));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    SHOW("wait on never-recorded", cudaStreamWaitEvent(s, never, 0));
    SHOW("wait on outside event", cudaStreamWaitEvent(s, outside, 0));
    cudaGraph_t g = (cudaGraph_t)1;
    SHOW("end", cudaStreamEndCapture(s, &g));
    return 0;
}
