/* Copies over stale bytes: simcuda gives a large block's pages fresh memory when a copy overwrites
 * most of them; what a program reads back must be what it would read without that (the copy's bytes
 * where it wrote, the stale pattern elsewhere, earlier writes kept), with copies side by side too. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

static unsigned char *expect;

static void put(char *dev, size_t off, size_t n, int value) {
    unsigned char *src = malloc(n);
    memset(src, value, n);
    cudaMemcpy(dev + off, src, n, cudaMemcpyHostToDevice);
    memcpy(expect + off, src, n);
    free(src);
}

static int same(const char *dev, size_t size) {
    unsigned char *got = malloc(size);
    cudaMemcpy(got, dev, size, cudaMemcpyDeviceToHost);
    int ok = memcmp(got, expect, size) == 0;
    free(got);
    return ok;
}

struct half {
    char *dev;
    int parity;
};

/* 384 KiB pieces, the even ones from one thread and the odd ones from the other. */
#define PIECE ((size_t)384 << 10)
static void *copy_half(void *arg) {
    const struct half *h = arg;
    unsigned char *src = malloc(PIECE);
    for (size_t i = (size_t)h->parity, off; (off = i * PIECE) + PIECE <= 8 * MIB; i += 2) {
        memset(src, (int)(0x10 + i), PIECE);
        cudaMemcpy(h->dev + off, src, PIECE, cudaMemcpyHostToDevice);
    }
    free(src);
    return NULL;
}

int main(void) {
    const size_t size = 8 * MIB;
    char *dev;
    expect = malloc(size);

    /* one block: partial pages (an unaligned start and end), a whole page, a small copy, and a page
     * written before a large copy reaches it */
    cudaMalloc((void **)&dev, size);
    cudaMemcpy(expect, dev, size, cudaMemcpyDeviceToHost); /* the stale bytes, read first */
    put(dev, 6 * MIB + 10, 8, 0x5a);                       /* page 3 written first ... */
    put(dev, 256 * 1024 + 3, 3 * MIB / 2, 0xab);           /* page 0 in part */
    put(dev, 2 * MIB, 2 * MIB + 700 * 1024 + 5, 0xcd);     /* page 1 whole, page 2 in part */
    put(dev, 5 * MIB + 100, 1000, 0xef);                   /* a small copy */
    put(dev, 6 * MIB + 512 * 1024, MIB, 0x77);             /* ... then most of page 3 */
    printf("block exact: %d\n", same(dev, size));
    cudaFree(dev);

    /* copies side by side into the same pages, on fresh blocks */
    int ok = 1;
    for (int round = 0; round < 8 && ok; round++) {
        cudaMalloc((void **)&dev, size);
        cudaMemcpy(expect, dev, size, cudaMemcpyDeviceToHost);
        for (size_t i = 0, off; (off = i * PIECE) + PIECE <= size; i++)
            memset(expect + off, (int)(0x10 + i), PIECE);
        pthread_t t[2];
        struct half h[2] = {{dev, 0}, {dev, 1}};
        for (int k = 0; k < 2; k++)
            pthread_create(&t[k], NULL, copy_half, &h[k]);
        for (int k = 0; k < 2; k++)
            pthread_join(t[k], NULL);
        ok = same(dev, size);
        cudaFree(dev);
    }
    printf("side by side exact: %d\n", ok);
    return 0;
}
