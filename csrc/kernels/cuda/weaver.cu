// Weaver's GPU-driven control, for a receiver that polls on the device (medusa/weaver/region.py is
// the layout). NOTE: nothing issues these kernels at run time yet: the engine's receiver polls the
// region on the host between its kernels; scripts/gpu/weaver_poll_check.cu tests the kernels alone.
// weaver_poll_kernel: one thread reads the sender's task counter in host-mapped (or peer) memory
// through a volatile pointer; a task newer than `done` is published in *pending for the offloaded
// attention kernels issued behind it (they exit at once when *pending is 0). With max_wait_ns > 0
// an idle receiver waits that long (%globaltimer), backing off with __nanosleep, then sets
// *timed_out so the host can run its own work or check on the sender.
// weaver_complete_kernel publishes the output: a system-wide fence, then done = pending.
#include <cstdint>

#define KERNEL extern "C" __global__ __attribute__((visibility("default")))

static __device__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

KERNEL void weaver_poll_kernel(const volatile int64_t *task, const volatile int64_t *done,
                               int64_t *pending, int *timed_out, int64_t max_wait_ns) {
    if (threadIdx.x != 0 || blockIdx.x != 0)
        return;
    uint64_t start = now_ns();
    unsigned sleep_ns = 32;
    for (;;) {
        int64_t t = *task, d = *done;
        if (t > d) {
            __threadfence_system(); // the payload written before the counter is read after it
            *pending = t;
            *timed_out = 0;
            return;
        }
        if (max_wait_ns <= 0 || now_ns() - start >= (uint64_t)max_wait_ns) {
            *pending = 0;
            *timed_out = max_wait_ns > 0;
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
