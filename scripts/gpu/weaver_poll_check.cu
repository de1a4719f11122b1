// Runs csrc/kernels/cuda/weaver.cu's polling kernels on a real GPU against a Weaver exchange
// region's counters in mapped host memory (region.py's layout: TASK at byte 64, DONE at 128), as
// a receiver would: a task already posted is seen at once; with none, a bounded poll times out; a
// poll spinning on the GPU sees the host's counter write, and the complete kernel publishes done.
// It covers the kernels only: the engine does not issue them (its receiver polls on the host).
// Every poll is bounded in time (1 s at most), so a poll that never sees the write fails, not hangs.
// Prints one line per case and "weaver poll: ok" (exit 0), or "FAIL ..." (exit 1).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <cuda_runtime.h>

#include "weaver.cu"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            std::printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_));                              \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            std::printf("FAIL " __VA_ARGS__);                                                      \
            std::printf("\n");                                                                     \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

enum { TASK = 64 / 8, DONE = 128 / 8 }; // int64 indices of region.py's counters
constexpr int64_t MS = 1000000;          // max_wait_ns of one millisecond

static int read_back(const int64_t *pending, const int *timed_out, int64_t *p, int *t) {
    CHECK(cudaMemcpy(p, pending, sizeof *p, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(t, timed_out, sizeof *t, cudaMemcpyDeviceToHost));
    return 0;
}

int main() {
    int64_t *hdr = nullptr, *dev_hdr = nullptr, *pending = nullptr;
    int *timed_out = nullptr;
    CHECK(cudaHostAlloc(reinterpret_cast<void **>(&hdr), 4096, cudaHostAllocMapped));
    std::memset(hdr, 0, 4096);
    CHECK(cudaHostGetDevicePointer(reinterpret_cast<void **>(&dev_hdr), hdr, 0));
    CHECK(cudaMalloc(&pending, sizeof *pending));
    CHECK(cudaMalloc(&timed_out, sizeof *timed_out));
    volatile int64_t *task = hdr + TASK, *done = hdr + DONE;
    int64_t p = -1;
    int t = -1;

    // 1. A task already posted: seen at once, then published as done.
    *task = 1;
    weaver_poll_kernel<<<1, 32>>>(dev_hdr + TASK, dev_hdr + DONE, pending, timed_out, 0);
    CHECK(cudaDeviceSynchronize());
    if (read_back(pending, timed_out, &p, &t))
        return 1;
    EXPECT(p == 1 && t == 0, "posted task: pending %lld timed_out %d, want 1 0", (long long)p, t);
    weaver_complete_kernel<<<1, 32>>>(dev_hdr + DONE, pending);
    CHECK(cudaDeviceSynchronize());
    EXPECT(*done == 1, "complete: done %lld, want 1", (long long)*done);
    std::printf("posted task: seen, done = 1\n");

    // 2. Nothing posted: a bounded poll gives up and says so; complete does nothing.
    weaver_poll_kernel<<<1, 32>>>(dev_hdr + TASK, dev_hdr + DONE, pending, timed_out, MS);
    weaver_complete_kernel<<<1, 32>>>(dev_hdr + DONE, pending);
    CHECK(cudaDeviceSynchronize());
    if (read_back(pending, timed_out, &p, &t))
        return 1;
    EXPECT(p == 0 && t == 1 && *done == 1, "idle poll: pending %lld timed_out %d done %lld",
           (long long)p, t, (long long)*done);
    std::printf("idle poll: timed out after 1 ms, done unchanged\n");

    // 3. A poll spinning on the GPU sees the host's write of the counter.
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    weaver_poll_kernel<<<1, 32, 0, s>>>(dev_hdr + TASK, dev_hdr + DONE, pending, timed_out,
                                        1000 * MS);
    weaver_complete_kernel<<<1, 32, 0, s>>>(dev_hdr + DONE, pending);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT(cudaStreamQuery(s) == cudaErrorNotReady, "spinning poll returned with no task posted");
    auto t0 = std::chrono::steady_clock::now();
    *task = 2;
    CHECK(cudaStreamSynchronize(s));
    auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0);
    if (read_back(pending, timed_out, &p, &t))
        return 1;
    EXPECT(*done == 2, "spinning poll: done %lld, want 2 (timed out: %d, after %.0f us)",
           (long long)*done, t, us.count());
    std::printf("spinning poll: host write seen and done = 2 within %.1f us\n", us.count());
    std::printf("weaver poll: ok\n");
    return 0;
}
