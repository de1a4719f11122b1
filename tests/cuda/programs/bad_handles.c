/* Garbage stream and graph handles get an error from simcuda, no crash. Not a parity program
 * (scripts/gpu/simcuda_parity.sh): the real runtime's behaviour on a handle it never made is
 * undefined (it may dereference it and crash), so only simcuda's answer is checked here. */
#include "common.h"

int main(void) {
    CHECK(cudaFree(0));
    SHOW("bad stream", cudaStreamSynchronize((cudaStream_t)0x1234));
    SHOW("bad graph launch", cudaGraphLaunch((cudaGraphExec_t)0x5678, 0));
    return 0;
}
