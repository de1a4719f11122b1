// Weaver's GPU-driven control (medusa/weaver/region.py is the layout): the receiver issues
// weaver_poll_kernel after each of its own kernels. One thread reads the sender's task counter in
// host-mapped (or peer) memory through a volatile pointer; a task newer than `done` is published
// in *pending for the offloaded attention kernels issued behind it (they exit at once when
// *pending is 0). With max_spins > 0 an idle receiver waits that many rounds, backing off with
// __nanosleep, then sets *timed_out so the host can run its own work or check on the sender.
// weaver_complete_kernel publishes the output: a system-wide fence, then done = pending.
#include <cstdint>

#define KERNEL extern "C" __global__ __attribute__((visibility("default")))

KERNEL void weaver_poll_kernel(const volatile int64_t *task, const volatile int64_t *done,
                               int64_t *pending, int *timed_out, int64_t max_spins) {
    if (threadIdx.x != 0 || blockIdx.x != 0)
        return;
    int64_t spins = 0;
    unsigned sleep_ns = 32;
    for (;;) {
        int64_t t = *task, d = *done;
        if (t > d) {
            __threadfence_system(); // the payload written before the counter is read after it
            *pending = t;
            *timed_out = 0;
            return;
        }
        if (spins++ >= max_spins) {
            *pending = 0;
            *timed_out = max_spins > 0;
            return;
        }
        __nanosleep(sleep_ns);
        sleep_ns = sleep_ns < 4096 ? sleep_ns * 2 : sleep_ns;
    }
}

KERNEL void weaver_complete_kernel(volatile int64_t *done, int64_t *pending) {
    if (threadIdx.x != 0 || blockIdx.x != 0 || *pending == 0)
        return;
    __threadfence_system(); // the output rows reach host memory before the counter says so
    *done = *pending;
    *pending = 0;
}
