/* The caching allocator of the PyTorch twin (caching_allocator_model.c), as torch's CUDA one:
 * cudaMalloc'd segments (2 MiB for blocks up to 1 MiB, 20 MiB up to 10 MiB, bigger ones alone,
 * rounded to 2 MiB) carved into 512-byte-rounded blocks by offset, split by torch's rule; a freed
 * block returns to the cache, merges with its free neighbours and is handed out again (best fit);
 * ca_empty_cache gives the default pool's fully free segments back. Pool 1 is the private pool
 * every capture allocates from, shared by all of them: a block one graph frees, the next takes. */
#ifndef CACHING_ALLOCATOR_H
#define CACHING_ALLOCATOR_H
#include <stddef.h>

#define MIB ((size_t)1 << 20)

void *ca_alloc(size_t n); /* NULL when out of memory or block slots */
void ca_free(void *p);
void ca_use_pool(int pool); /* 0: the default pool; 1: the graph pool */
int ca_empty_cache(void);   /* a cudaError_t */
#endif
