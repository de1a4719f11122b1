/* The simcuda twin of a PyTorch decoder's device side (scripts/gpu/torch_restore/decoder.py): a
 * shared library caching_allocator.py drives as Python drives libtorch, its memory from the
 * caching allocator (caching_allocator.c), so that every pointer a graph holds is a
 * sub-allocation of some segment:
 * - a GEMM library whose module registers at its first call and whose kernels are not exported
 *   (cuBLAS): split-K into a per-stream workspace made at the first GEMM on a stream, a
 *   by-value parameter struct holding pointers, a memset node before the reduction;
 * - model kernels registered at load with unexported stubs (torch's); a two-layer decoder step
 *   whose attention reads the KV cache's pointers from a device-side table made in the graph
 *   pool at the first capture (pointer words into the middle of a segment, saved and
 *   relocated); logits copied into a static output buffer by a memcpy node;
 * - weights loaded through a 12 MiB staging buffer that empty_cache gives back.
 * Returns are cudaError_t. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "caching_allocator.h"
#include "simcuda/simcuda.h"

enum { D = 64, V = 128, LEN = 16, MAXB = 4, LAYERS = 2, SPLITS = 4 };
#define WORKSPACE (16 * MIB) /* over 10 MiB: a segment of its own, as cuBLAS's on an H100 */
#define TRY(x)                                                                                     \
    do {                                                                                           \
        int e_ = (int)(x);                                                                         \
        if (e_)                                                                                    \
            return e_;                                                                             \
    } while (0)

/* ---- model kernels: registered at load, stubs not exported ---- */
static const int *ints(const void *p) { return (const int *)p; }
#define P(i, T) (*(T *const *)((const char *)p + 8 * (i)))

static void embed(const simcuda_kctx *c, const void *p) { /* x, table, tokens, n */
    (void)c;
    for (int b = 0; b < *ints((const char *)p + 24); b++)
        memcpy(P(0, float) + b * D, P(1, float) + P(2, int)[b] * D, D * sizeof(float));
}
static void rmsnorm(const simcuda_kctx *c, const void *p) { /* out, x, w, n */
    (void)c;
    const float *x = P(1, float), *w = P(2, float);
    for (int b = 0; b < *ints((const char *)p + 24); b++) {
        float s = 0;
        for (int i = 0; i < D; i++)
            s += x[b * D + i] * x[b * D + i];
        float r = 1.0f / sqrtf(s / D + 1e-6f);
        for (int i = 0; i < D; i++)
            P(0, float)[b * D + i] = x[b * D + i] * r * w[i];
    }
}
static void add(const simcuda_kctx *c, const void *p) { /* out, a, b, n */
    (void)c;
    for (int i = 0; i < *ints((const char *)p + 24); i++)
        P(0, float)[i] = P(1, float)[i] + P(2, float)[i];
}
static void swish(const simcuda_kctx *c, const void *p) { /* out, a, unused, n */
    (void)c;
    for (int i = 0; i < *ints((const char *)p + 24); i++)
        P(0, float)[i] = P(1, float)[i] / (1.0f + expf(-P(1, float)[i]));
}
/* Params: out or 0, table, qkv, positions, layer, n. With out 0: write this step's K and V. */
static void attend(const simcuda_kctx *c, const void *p) {
    (void)c;
    float *const *table = P(1, float *);
    const float *qkv = P(2, float);
    const int *pos = P(3, int), layer = ints((const char *)p + 32)[0];
    float *kc = table[2 * layer], *vc = table[2 * layer + 1];
    for (int b = 0; b < ints((const char *)p + 32)[1]; b++) {
        const float *q = qkv + b * 3 * D, *kv = kc + b * LEN * D, *vv = vc + b * LEN * D;
        if (!P(0, float)) {
            memcpy(kc + (b * LEN + pos[b]) * D, q + D, D * sizeof(float));
            memcpy(vc + (b * LEN + pos[b]) * D, q + 2 * D, D * sizeof(float));
            continue;
        }
        float w[LEN], m = -INFINITY, sum = 0;
        for (int t = 0; t <= pos[b]; t++) {
            w[t] = 0;
            for (int i = 0; i < D; i++)
                w[t] += q[i] * kv[t * D + i] / sqrtf((float)D);
            m = fmaxf(m, w[t]);
        }
        for (int t = 0; t <= pos[b]; t++)
            sum += w[t] = expf(w[t] - m);
        for (int i = 0; i < D; i++) {
            float o = 0;
            for (int t = 0; t <= pos[b]; t++)
                o += w[t] / sum * vv[t * D + i];
            P(0, float)[b * D + i] = o;
        }
    }
}
SIMCUDA_HIDDEN_STUB(embed_stub)
SIMCUDA_HIDDEN_STUB(rmsnorm_stub)
SIMCUDA_HIDDEN_STUB(add_stub)
SIMCUDA_HIDDEN_STUB(attend_stub)
SIMCUDA_HIDDEN_STUB(swish_stub)
static const simcuda_kernel_desc model_kernels[] = {
    {"_ZN2ca5embedEPfPKfPKii", "p p p i", embed, (const void *)embed_stub},
    {"_ZN2ca7rmsnormEPfPKfS2_i", "p p p i", rmsnorm, (const void *)rmsnorm_stub},
    {"_ZN2ca3addEPfPKfS2_i", "p p p i", add, (const void *)add_stub},
    {"_ZN2ca6attendEPfPKPfPKfPKiii", "p p p p i i", attend, (const void *)attend_stub},
    {"_ZN2ca5swishEPfPKfS2_i", "p p p i", swish, (const void *)swish_stub},
};
SIMCUDA_MODULE(ca_model, model_kernels, NULL, 0)

/* ---- the GEMM library: registered at its first call, kernels not exported ---- */
struct gemm { const float *a, *b; float *ws; int m, n, k, splits; };
static void gemm_partial(const simcuda_kctx *c, const void *p) {
    (void)c;
    const struct gemm *g = p;
    for (int s = 0; s < g->splits; s++)
        for (int i = 0; i < g->m * g->n; i++) {
            float acc = 0;
            for (int l = s * g->k / g->splits; l < (s + 1) * g->k / g->splits; l++)
                acc += g->a[i / g->n * g->k + l] * g->b[l * g->n + i % g->n];
            g->ws[s * g->m * g->n + i] = acc;
        }
}
static void gemm_reduce(const simcuda_kctx *c, const void *p) { /* out, ws, mn, splits */
    (void)c;
    const int mn = ints((const char *)p + 16)[0], splits = ints((const char *)p + 16)[1];
    for (int s = 0; s < splits; s++)
        for (int i = 0; i < mn; i++)
            P(0, float)[i] += P(1, float)[s * mn + i];
}
SIMCUDA_HIDDEN_STUB(partial_stub)
SIMCUDA_HIDDEN_STUB(reduce_stub)
static const simcuda_kernel_desc gemm_kernels[] = {
    {"_ZN6cablas12gemm_partialENS_4gemmE", "s40@0,8,16", gemm_partial, (const void *)partial_stub},
    {"_ZN6cablas11gemm_reduceEPfPKfii", "p p i i", gemm_reduce, (const void *)reduce_stub},
};
SIMCUDA_MODULE_LAZY(cablas, gemm_kernels, NULL, 0)

static struct { cudaStream_t stream; float *ws; } workspaces[4];
static int gemm_ready;

static float *workspace(cudaStream_t s) { /* made at the first GEMM on s, in the current pool */
    for (int i = 0; i < 4; i++)
        if (workspaces[i].ws && workspaces[i].stream == s)
            return workspaces[i].ws;
    for (int i = 0; i < 4; i++)
        if (!workspaces[i].ws)
            return workspaces[i].stream = s, workspaces[i].ws = ca_alloc(WORKSPACE);
    return NULL;
}

static int launch(const void *stub, void **args, cudaStream_t s) {
    return cudaLaunchKernel(stub, (dim3){1, 1, 1}, (dim3){64, 1, 1}, args, 0, s);
}

/* out[m x n] = a[m x k] * b[k x n], row-major. */
static int gemm(float *out, const float *a, const float *b, int m, int n, int k, cudaStream_t s) {
    if (!gemm_ready++)
        TRY(simcudaRegisterModule(&__simcuda_module_cablas));
    struct gemm g = {a, b, workspace(s), m, n, k, SPLITS};
    int mn = m * n, splits = SPLITS;
    void *pa[] = {&g}, *ra[] = {&out, &g.ws, &mn, &splits};
    if (!g.ws)
        return cudaErrorMemoryAllocation;
    TRY(cudaMemsetAsync(out, 0, (size_t)mn * sizeof(float), s));
    TRY(launch((const void *)partial_stub, pa, s));
    return launch((const void *)reduce_stub, ra, s);
}

/* ---- the model ---- */
enum { F = 6144, NW = 2 + 5 * LAYERS }; /* F: MLP weights of 1.5 MiB, carved from 20 MiB */
static struct {
    cudaStream_t s;
    float *w[NW], *kv, *out, **eager_table; /* w: emb, wout, then per layer norm qkv o up down */
    int *tokens, *pos;
} M;
static const size_t sizes[5] = {D, D * 3 * D, D * D, D * F, F * D};
#define LW(l, i) M.w[2 + 5 * (l) + (i)]

/* The weights, allocated one by one, filled from the checkpoint read into one device buffer
 * (12 MiB: a segment of its own, freed after loading and given back by empty_cache). */
static int load_weights(uint32_t seed) {
    size_t n[NW] = {V * D, D * V}, total = 0;
    float *stage = ca_alloc(12 * MIB), *host;
    for (int i = 2; i < NW; i++)
        n[i] = sizes[(i - 2) % 5];
    for (int i = 0; i < NW; i++)
        if (!(M.w[i] = ca_alloc(n[i] * 4)))
            return cudaErrorMemoryAllocation;
    for (int i = 0; i < NW; i++)
        total += n[i];
    TRY(cudaMallocHost((void **)&host, total * 4));
    for (size_t i = 0; i < total; i++, seed = seed * 1664525u + 1013904223u)
        host[i] = ((float)(seed >> 8) / (1 << 24) - 0.5f) / 4;
    int e = stage ? (int)cudaMemcpy(stage, host, total * 4, cudaMemcpyHostToDevice)
                  : (int)cudaErrorMemoryAllocation;
    for (int i = 0, off = 0; i < NW && !e; off += n[i++])
        e = (int)cudaMemcpy(M.w[i], stage + off, n[i] * 4, cudaMemcpyDeviceToDevice);
    ca_free(stage);
    cudaFreeHost(host);
    return e;
}

/* One decode step of `n` sequences, on M.s, its temporaries from the current pool. */
static int step(int n, float **table) {
    float *x = ca_alloc(n * D * 4), *h = ca_alloc(n * D * 4), *qkv = ca_alloc(n * 3 * D * 4);
    float *none = NULL, *up, *down;
    int nd = n * D, nf = n * F;
    void *e[] = {&x, &M.w[0], &M.tokens, &n}, *sw[] = {&up, &up, &up, &nf};
    TRY(launch((const void *)embed_stub, e, M.s));
    for (int l = 0; l < LAYERS; l++) {
        void *r[] = {&h, &x, &LW(l, 0), &n}, *w[] = {&none, &table, &qkv, &M.pos, &l, &n};
        TRY(launch((const void *)rmsnorm_stub, r, M.s));
        TRY(gemm(qkv, h, LW(l, 1), n, 3 * D, D, M.s));
        TRY(launch((const void *)attend_stub, w, M.s));
        ca_free(h);
        float *att = ca_alloc(n * D * 4), *o = ca_alloc(n * D * 4); /* att: h's block again */
        void *at[] = {&att, &table, &qkv, &M.pos, &l, &n}, *ad[] = {&x, &x, &o, &nd};
        TRY(launch((const void *)attend_stub, at, M.s));
        TRY(gemm(o, att, LW(l, 2), n, D, D, M.s));
        TRY(launch((const void *)add_stub, ad, M.s));
        ca_free(att), ca_free(o);
        up = ca_alloc(n * F * 4), down = ca_alloc(n * D * 4);
        void *md[] = {&x, &x, &down, &nd};
        TRY(gemm(up, x, LW(l, 3), n, F, D, M.s));
        TRY(launch((const void *)swish_stub, sw, M.s));
        TRY(gemm(down, up, LW(l, 4), n, D, F, M.s));
        TRY(launch((const void *)add_stub, md, M.s));
        ca_free(up), ca_free(down);
        h = ca_alloc(n * D * 4);
    }
    float *logits = ca_alloc(n * V * 4);
    TRY(gemm(logits, x, M.w[1], n, V, D, M.s));
    TRY(cudaMemcpyAsync(M.out, logits, (size_t)n * V * 4, cudaMemcpyDeviceToDevice, M.s));
    ca_free(x), ca_free(h), ca_free(qkv), ca_free(logits);
    return 0;
}

/* A table of the KV cache's per-layer K and V pointers, in the current pool. */
static float **kv_table(void) {
    float *host[2 * LAYERS], **t = ca_alloc(sizeof host);
    for (int i = 0; i < 2 * LAYERS; i++)
        host[i] = M.kv + (size_t)i * MAXB * LEN * D;
    return t && !cudaMemcpy(t, host, sizeof host, cudaMemcpyHostToDevice) ? t : NULL;
}

SIMCUDA_EXPORT int ca_setup(uint32_t seed) {
    size_t kv = (size_t)2 * LAYERS * MAXB * LEN * D * 4;
    TRY(cudaStreamCreate(&M.s));
    TRY(load_weights(seed));
    M.kv = ca_alloc(kv), M.out = ca_alloc(MAXB * V * 4);
    M.tokens = ca_alloc(MAXB * 4), M.pos = ca_alloc(MAXB * 4);
    if (!M.kv || !M.out || !M.tokens || !M.pos || !(M.eager_table = kv_table()))
        return cudaErrorMemoryAllocation;
    TRY(cudaMemset(M.kv, 0, kv));
    TRY(cudaMemset(M.tokens, 0, MAXB * 4));
    return cudaMemset(M.pos, 0, MAXB * 4);
}

SIMCUDA_EXPORT int ca_warmup(int n) {
    TRY(step(n, M.eager_table));
    return cudaStreamSynchronize(M.s);
}

SIMCUDA_EXPORT int ca_capture(int n, cudaGraphExec_t *exec) {
    static float **table; /* made at the first capture, before any graph's temporaries: a block
                           * one graph frees, the next may take, and replays would clobber it */
    ca_use_pool(1);
    if (!table)
        table = kv_table();
    cudaGraph_t g;
    int e = table ? (int)cudaStreamBeginCapture(M.s, cudaStreamCaptureModeGlobal)
                  : (int)cudaErrorMemoryAllocation;
    int e2 = e ? e : step(n, table), e3 = e ? e : (int)cudaStreamEndCapture(M.s, &g);
    ca_use_pool(0);
    TRY(e2 ? e2 : e3);
    TRY(cudaGraphInstantiate(exec, g, 0));
    return cudaGraphDestroy(g);
}

SIMCUDA_EXPORT int ca_inputs(int n, int s) { /* tokens and positions of decode step s */
    int tok[MAXB], pos[MAXB];
    for (int b = 0; b < n; b++)
        tok[b] = (7 * b + 3 * n + 11 * s) % V, pos[b] = (b + n + s) % LEN;
    TRY(cudaMemcpy(M.tokens, tok, n * 4, cudaMemcpyHostToDevice));
    return cudaMemcpy(M.pos, pos, n * 4, cudaMemcpyHostToDevice);
}

SIMCUDA_EXPORT int ca_output(int n, float *host) {
    return cudaMemcpy(host, M.out, (size_t)n * V * 4, cudaMemcpyDeviceToHost);
}

SIMCUDA_EXPORT uintptr_t ca_stream(void) { return (uintptr_t)M.s; }
