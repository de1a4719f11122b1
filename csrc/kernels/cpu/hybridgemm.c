/* HybridGEMM on simcuda: O[M,N] = X[M,K] . W^T, W stored as nn.Linear's [N,K] (in host-mapped
 * memory on a superchip), X in device memory, O fp32. Output columns [0, split) run
 * output-stationary (BM x BN output tiles, K swept in BK steps); columns [split, N) run
 * weight-stationary (a WBK x WBN tile of W stays on chip while M is swept in WBM steps, partial
 * outputs accumulated into O with atomic adds, so those columns must be zero: the caller clears
 * them, as on a GPU, where no block can). Every tile read is reported to simcuda's traffic
 * counters exactly as medusa/c2c/model.py counts it. Same contract as csrc/kernels/cuda/ and
 * medusa/c2c/triton_gemm.py. Inputs: dtype 0 fp32, 1 fp16, 2 bf16 (converted, fp32 accumulate). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simcuda/simcuda.h"

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (!man) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 113;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | exp << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13;
    } else {
        bits = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float load(const void *base, int dtype, size_t i) {
    if (dtype == 0)
        return ((const float *)base)[i];
    uint16_t v = ((const uint16_t *)base)[i];
    if (dtype == 1)
        return half_to_float(v);
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

struct hg_args {
    float *o; const void *x, *w;
    int m, n, k, split, dtype, bm, bn, bk, wbm, wbn, wbk;
};

static int min_i(int a, int b) { return a < b ? a : b; }

/* A run of n inputs as fp32: the data itself when it is fp32, else converted into buf. */
static const float *row(const struct hg_args *a, float *buf, size_t i, int n) {
    if (a->dtype == 0)
        return (const float *)a->x + i;
    for (int l = 0; l < n; l++)
        buf[l] = load(a->x, a->dtype, i + l);
    return buf;
}

/* An fp32 dot product in eight independent lanes (so the compiler vectorizes it; the order of
 * the sums is fixed, so results are the same on every run), the lanes added pairwise. */
static float dot_f32(const float *x, const float *w, int n) {
    float s[8] = {0};
    int l = 0;
    for (; l + 8 <= n; l += 8)
        for (int j = 0; j < 8; j++)
            s[j] += x[l + j] * w[l + j];
    float t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; l < n; l++)
        t += x[l] * w[l];
    return t;
}

/* Eight fp32 lanes (GCC/Clang vector extension: the lanes are dot_f32's, whatever the compiler's
 * optimisation level makes of plain loops; loaded with memcpy, from any alignment). */
typedef float v8f __attribute__((vector_size(32)));

/* dot_f32's pairwise sum of its eight lanes. */
static float lanes_sum(const v8f *v) {
    float q[8];
    memcpy(q, v, sizeof q);
    return ((q[0] + q[4]) + (q[1] + q[5])) + ((q[2] + q[6]) + (q[3] + q[7]));
}

/* Four rows of W (ld apart) against one run of x, added into out[0..3]: each row's sum exactly as
 * dot_f32 makes it (the same eight lanes, added the same way), with x loaded once for the four.
 * Cloned for AVX2 where the CPU has it (wider registers, never FMA: the same roundings). */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))
#endif
static void dot4_f32(const float *x, const float *w, size_t ld, int n, float *out) {
    v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    const float *w1 = w + ld, *w2 = w + 2 * ld, *w3 = w + 3 * ld;
    int l = 0;
    for (; l + 8 <= n; l += 8) {
        v8f xv, a, b, c, d;
        memcpy(&xv, x + l, sizeof xv);
        memcpy(&a, w + l, sizeof a);
        memcpy(&b, w1 + l, sizeof b);
        memcpy(&c, w2 + l, sizeof c);
        memcpy(&d, w3 + l, sizeof d);
        s0 += xv * a;
        s1 += xv * b;
        s2 += xv * c;
        s3 += xv * d;
    }
    float t[4] = {lanes_sum(&s0), lanes_sum(&s1), lanes_sum(&s2), lanes_sum(&s3)};
    for (int r = 0; r < 4; r++) {
        const float *wr = w + (size_t)r * ld;
        for (int i = l; i < n; i++)
            t[r] += x[i] * wr[i];
        out[r] += t[r];
    }
}

static float dot(const struct hg_args *a, size_t xi, size_t wi, int n) {
    if (a->dtype == 0)
        return dot_f32((const float *)a->x + xi, (const float *)a->w + wi, n);
    float s = 0;
    for (int l = 0; l < n; l++)
        s += load(a->x, a->dtype, xi + l) * load(a->w, a->dtype, wi + l);
    return s;
}

/* Reports rows x cols elements of a row-major matrix with leading dimension ld. A matrix lies in
 * one allocation, so the tile's first element classifies all of it: one count per tile, not
 * per row (each count takes simcuda's lock to classify the address). */
static void count_tile(const void *base, size_t elem, int ld, int r0, int rows, int c0, int cols) {
    if (rows > 0 && cols > 0)
        simcudaCountRead((const char *)base + ((size_t)r0 * ld + c0) * elem,
                         (size_t)rows * cols * elem);
}

static size_t elem_size(const struct hg_args *a) { return a->dtype == 0 ? 4 : 2; }

/* Output-stationary part p: output columns [p * BN, +BN) of [0, split), every row tile. */
static void output_stationary(void *arg, int part) {
    const struct hg_args *a = arg;
    size_t e = elem_size(a);
    int n0 = part * a->bn, bn = min_i(a->bn, a->split - n0);
    float *acc = malloc((size_t)a->bm * a->bn * sizeof *acc);
    for (int m0 = 0; acc && m0 < a->m; m0 += a->bm) {
        int bm = min_i(a->bm, a->m - m0);
        memset(acc, 0, (size_t)a->bm * a->bn * sizeof *acc);
        for (int k0 = 0; k0 < a->k; k0 += a->bk) {
            int bk = min_i(a->bk, a->k - k0);
            count_tile(a->x, e, a->k, m0, bm, k0, bk);
            count_tile(a->w, e, a->k, n0, bn, k0, bk);
            for (int i = 0; i < bm; i++)
                for (int j = 0; j < bn; j++)
                    acc[i * a->bn + j] += dot(a, (size_t)(m0 + i) * a->k + k0,
                                              (size_t)(n0 + j) * a->k + k0, bk);
        }
        for (int i = 0; i < bm; i++)
            memcpy(a->o + (size_t)(m0 + i) * a->n + n0, acc + (size_t)i * a->bn, (size_t)bn * 4);
    }
    free(acc);
}

/* The bytes weight-stationary part p's tile schedule reads (a W tile once, kept on chip; per row
 * tile, X and the O that the atomic adds read), counted as that schedule would. */
static void count_weight_stationary(const struct hg_args *a, int n0, int bn) {
    size_t e = elem_size(a);
    for (int k0 = 0; k0 < a->k; k0 += a->wbk) {
        int bk = min_i(a->wbk, a->k - k0);
        count_tile(a->w, e, a->k, n0, bn, k0, bk);
        for (int m0 = 0; m0 < a->m; m0 += a->wbm) {
            int bm = min_i(a->wbm, a->m - m0);
            count_tile(a->x, e, a->k, m0, bm, k0, bk);
            count_tile(a->o, 4, a->n, m0, bm, n0, bn);
        }
    }
}

/* fp32 W where it lies (a CPU's cache is its "chip"): each output's K tiles are summed and added
 * in K order as the tile schedule adds them, but a group of four W rows is read from start to
 * end, which the CPU prefetches far better than 128-element pieces of 64 rows. */
static void weight_stationary_f32(const struct hg_args *a, int n0, int bn) {
    const float *x = a->x, *w = (const float *)a->w + (size_t)n0 * a->k;
    for (int i = 0; i < a->m; i++) {
        float *o = a->o + (size_t)i * a->n + n0;
        const float *xr = x + (size_t)i * a->k;
        int j = 0;
        for (; j + 4 <= bn; j += 4)
            for (int k0 = 0; k0 < a->k; k0 += a->wbk)
                dot4_f32(xr + k0, w + (size_t)j * a->k + k0, (size_t)a->k,
                         min_i(a->wbk, a->k - k0), o + j);
        for (; j < bn; j++)
            for (int k0 = 0; k0 < a->k; k0 += a->wbk)
                o[j] += dot_f32(xr + k0, w + (size_t)j * a->k + k0, min_i(a->wbk, a->k - k0));
    }
}

/* fp16/bf16 W: each W tile converted once, then swept over the rows. */
static void weight_stationary_half(const struct hg_args *a, int n0, int bn) {
    float *wt = malloc((size_t)a->wbn * a->wbk * sizeof *wt);
    float *xbuf = malloc((size_t)a->wbk * sizeof *xbuf);
    for (int k0 = 0; k0 < a->k && wt && xbuf; k0 += a->wbk) {
        int bk = min_i(a->wbk, a->k - k0);
        for (int j = 0; j < bn; j++)
            for (int l = 0; l < bk; l++)
                wt[j * a->wbk + l] = load(a->w, a->dtype, (size_t)(n0 + j) * a->k + k0 + l);
        for (int i = 0; i < a->m; i++) {
            const float *xr = row(a, xbuf, (size_t)i * a->k + k0, bk);
            float *o = a->o + (size_t)i * a->n + n0;
            for (int j = 0; j < bn; j++)
                o[j] += dot_f32(xr, wt + (size_t)j * a->wbk, bk);
        }
    }
    free(wt);
    free(xbuf);
}

/* Weight-stationary part p: output columns [split + p * WBN, +WBN). */
static void weight_stationary(void *arg, int part) {
    const struct hg_args *a = arg;
    int n0 = a->split + part * a->wbn, bn = min_i(a->wbn, a->n - n0);
    count_weight_stationary(a, n0, bn);
    if (a->dtype == 0)
        weight_stationary_f32(a, n0, bn);
    else
        weight_stationary_half(a, n0, bn);
}

/* W of at least this many elements is split over simcuda's threads (smaller: the hand-off
 * would cost more than it saves). */
enum { PARALLEL_ELEMS = 1 << 16 };

static void run_parts(const struct hg_args *a, int parts, void (*fn)(void *, int)) {
    if ((size_t)a->n * a->k >= PARALLEL_ELEMS)
        simcudaParallel(parts, fn, (void *)a);
    else
        for (int i = 0; i < parts; i++)
            fn((void *)a, i);
}

static void hybrid_gemm(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct hg_args *a = p;
    size_t e = elem_size(a);
    simcudaAccess(a->x, (size_t)a->m * a->k * e, SIMCUDA_READ);
    simcudaAccess(a->w, (size_t)a->n * a->k * e, SIMCUDA_READ);
    simcudaAccess(a->o, (size_t)a->m * a->n * 4, /* columns [split, n) accumulate */
                  a->split < a->n ? SIMCUDA_READ | SIMCUDA_WRITE : SIMCUDA_WRITE);
    if (a->split > 0)
        run_parts(a, (a->split + a->bn - 1) / a->bn, output_stationary);
    if (a->split < a->n)
        run_parts(a, (a->n - a->split + a->wbn - 1) / a->wbn, weight_stationary);
}

SIMCUDA_STUB(hybrid_gemm_kernel)

static const simcuda_kernel_desc kernels[] = {
    {"hybrid_gemm_kernel", "p p p i i i i i i i i i i i", hybrid_gemm, hybrid_gemm_kernel},
};

SIMCUDA_MODULE(medusa_c2c, kernels, NULL, 0)
