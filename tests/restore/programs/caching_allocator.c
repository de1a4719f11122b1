/* The caching allocator (caching_allocator.h says what it does). */
#include "caching_allocator.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "simcuda/simcuda.h"

enum { MAXBLK = 512, MAXSEG = 64 };
typedef struct { uintptr_t base; size_t size; int pool, kind; } segment;
typedef struct { uintptr_t addr; size_t size; int seg, used; } block; /* size 0: slot unused */
static struct { segment seg[MAXSEG]; block blk[MAXBLK]; int nseg, pool; } A;

static int kind_of(size_t n) { return n <= MIB ? 0 : n <= 10 * MIB ? 1 : 2; }
static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static block *slot(void) {
    for (int i = 0; i < MAXBLK; i++)
        if (!A.blk[i].size)
            return &A.blk[i];
    return NULL;
}

static block *best_fit(size_t n, int kind) {
    block *best = NULL;
    for (int i = 0; i < MAXBLK; i++) {
        block *b = &A.blk[i];
        segment *s = &A.seg[b->seg];
        if (b->size >= n && !b->used && s->pool == A.pool && s->kind == kind &&
            (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr)))
            best = b;
    }
    return best;
}

void *ca_alloc(size_t n) {
    n = round_up(n ? n : 1, 512);
    int kind = kind_of(n);
    block *b = best_fit(n, kind);
    if (!b) {
        size_t size = kind == 0 ? 2 * MIB : kind == 1 ? 20 * MIB : round_up(n, 2 * MIB);
        void *p;
        if (A.nseg == MAXSEG || !(b = slot()) || cudaMalloc(&p, size))
            return NULL;
        A.seg[A.nseg] = (segment){(uintptr_t)p, size, A.pool, kind};
        *b = (block){(uintptr_t)p, size, A.nseg++, 0};
    }
    block *rest = b->size - n >= (kind ? MIB + 1 : 512) ? slot() : NULL; /* torch's split rule */
    if (rest) {
        *rest = (block){b->addr + n, b->size - n, b->seg, 0};
        b->size = n;
    }
    b->used = 1;
    return (void *)b->addr;
}

static block *find(uintptr_t addr) {
    for (int i = 0; i < MAXBLK; i++)
        if (A.blk[i].size && A.blk[i].addr == addr)
            return &A.blk[i];
    return NULL;
}

void ca_free(void *p) {
    block *b = find((uintptr_t)p), *next;
    if (!b)
        return;
    b->used = 0;
    while ((next = find(b->addr + b->size)) && next->seg == b->seg && !next->used)
        b->size += next->size, next->size = 0;
    for (int i = 0; i < MAXBLK; i++) {
        block *prev = &A.blk[i];
        if (prev->size && !prev->used && prev->seg == b->seg && prev->addr + prev->size == b->addr)
            prev->size += b->size, b->size = 0;
    }
}

void ca_use_pool(int pool) { A.pool = pool; }

/* torch.cuda.empty_cache */
SIMCUDA_EXPORT int ca_empty_cache(void) {
    for (int i = 0; i < MAXBLK; i++) {
        block *b = &A.blk[i];
        segment *s = &A.seg[b->seg];
        if (b->size && !b->used && s->pool == 0 && b->size == s->size && s->size) {
            int e = cudaFree((void *)s->base);
            if (e)
                return e;
            s->size = 0, b->size = 0;
        }
    }
    return 0;
}
