// csrc/kernels/cuda/hybridgemm.cu's kernel run on the CPU, to test its tiling without a GPU: each
// block's threads are std::threads that meet at a std::barrier for __syncthreads, a block's
// shared memory is one array (blocks run one after another), atomicAdd takes a lock.
//   hybridgemm_host M N K SPLIT DTYPE BM BN BK WBM WBN WBK THREADS GRID_X X W O
// reads X [M,K] and W [N,K] (raw, DTYPE 0 fp32, 1 fp16, 2 bf16), writes O [M,N] fp32.
#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

struct dim3_t {
    unsigned x, y, z;
};
static thread_local dim3_t threadIdx, blockIdx;
static dim3_t blockDim, gridDim;
static std::barrier<> *block_barrier;
static std::mutex atomic_lock;

static void __syncthreads() { block_barrier->arrive_and_wait(); }
static float atomicAdd(float *p, float v) {
    std::lock_guard<std::mutex> hold(atomic_lock);
    float old = *p;
    *p = old + v;
    return old;
}
using std::max;
using std::min;

#define __global__
#define __device__
#define __shared__
constexpr size_t SHARED_FLOATS = 64 * 1024 / 4;
alignas(16) float smem[SHARED_FLOATS];

#include "hybridgemm.cu"

static std::vector<char> slurp(const char *path, size_t bytes) {
    std::vector<char> v(bytes);
    FILE *f = std::fopen(path, "rb");
    if (!f || std::fread(v.data(), 1, bytes, f) != bytes) {
        std::fprintf(stderr, "cannot read %zu bytes from %s\n", bytes, path);
        std::exit(2);
    }
    std::fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc != 17) {
        std::fprintf(stderr, "usage: see the head of hybridgemm_host.cpp\n");
        return 2;
    }
    int a[13];
    for (int i = 0; i < 13; i++)
        a[i] = std::atoi(argv[1 + i]);
    int m = a[0], n = a[1], k = a[2], dtype = a[4];
    size_t elem = dtype == 0 ? 4 : 2;
    std::vector<char> x = slurp(argv[14], m * k * elem), w = slurp(argv[15], n * k * elem);
    std::vector<float> o(size_t(m) * n, 0.0f);
    blockDim = {unsigned(a[11]), 1, 1};
    gridDim = {unsigned(a[12]), 2, 1};
    for (unsigned by = 0; by < 2; by++)
        for (unsigned bx = 0; bx < gridDim.x; bx++) {
            std::barrier<> sync(blockDim.x);
            block_barrier = &sync;
            std::vector<std::thread> threads;
            for (unsigned t = 0; t < blockDim.x; t++)
                threads.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    hybrid_gemm_kernel(o.data(), x.data(), w.data(), m, n, k, a[3], dtype, a[5],
                                       a[6], a[7], a[8], a[9], a[10]);
                });
            for (auto &th : threads)
                th.join();
        }
    FILE *f = std::fopen(argv[16], "wb");
    if (!f || std::fwrite(o.data(), 4, o.size(), f) != o.size())
        return 2;
    std::fclose(f);
    return 0;
}
