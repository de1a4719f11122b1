/* Fresh device memory: what it holds, where it is placed, what it costs. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

static unsigned long long word_at(const char *p, size_t off) {
    unsigned long long w = 0;
    cudaMemcpy(&w, p + off, sizeof w, cudaMemcpyDeviceToHost);
    return w;
}

int main(void) {
    char *small, *big, *pad;
    size_t free0, free1, total;
    cudaMalloc((void **)&small, 4096);
    printf("small word: %llx\n", word_at(small, 512));
    cudaMemset(small, 0, 4096);
    cudaFree(small);
    cudaMalloc((void **)&small, 4096);
    printf("reused word: %llx\n", word_at(small, 512));
    cudaMemGetInfo(&free0, &total);
    cudaMalloc((void **)&pad, (2u << 20) + 4096);
    cudaMemGetInfo(&free1, &total);
    printf("pad costs: %zu\n", free0 - free1);
    printf("pad aligned: %d\n", (int)((uintptr_t)pad % (2u << 20) == 0));
    cudaMalloc((void **)&big, (size_t)1 << 30);
    printf("big word: %llx\n", word_at(big, ((size_t)1 << 29) + 8));
    unsigned long long one = 1;
    cudaMemcpy(big + 4096, &one, 8, cudaMemcpyHostToDevice);
    printf("big written: %llx\n", word_at(big, 4096));
    return 0;
}
