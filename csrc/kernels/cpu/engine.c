/* The reference engine's kernels on simcuda. Same names and parameters as
 * csrc/kernels/cuda/engine.cu. Tensors are row-major float32; a "stride" is the distance in floats
 * between two tokens' rows. Matrix multiplies are not here: they go through the mblas library. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simcuda/simcuda.h"

#define R SIMCUDA_READ
#define W SIMCUDA_WRITE
#define RW (SIMCUDA_READ | SIMCUDA_WRITE)

struct embed_args { float *out; const float *table; const int *ids; int num_tokens, dim; };
static void embed(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct embed_args *a = p;
    simcudaAccess(a->ids, (size_t)a->num_tokens * 4, R);
    simcudaAccess(a->out, (size_t)a->num_tokens * a->dim * 4, W);
    for (int t = 0; t < a->num_tokens; t++)
        simcudaAccess(a->table + (size_t)a->ids[t] * a->dim, (size_t)a->dim * 4, R);
    for (int t = 0; t < a->num_tokens; t++) {
        const float *row = a->table + (size_t)a->ids[t] * a->dim;
        simcudaCountRead(row, (size_t)a->dim * 4);
        memcpy(a->out + (size_t)t * a->dim, row, (size_t)a->dim * 4);
    }
}

struct norm_args { float *out; const float *x; const float *w; int num_tokens, dim; float eps; };
static void rms_norm(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct norm_args *a = p;
    simcudaAccess(a->x, (size_t)a->num_tokens * a->dim * 4, R);
    simcudaAccess(a->w, (size_t)a->dim * 4, R);
    simcudaAccess(a->out, (size_t)a->num_tokens * a->dim * 4, W);
    simcudaCountRead(a->x, (size_t)a->num_tokens * a->dim * 4);
    for (int t = 0; t < a->num_tokens; t++) {
        const float *x = a->x + (size_t)t * a->dim;
        float *o = a->out + (size_t)t * a->dim;
        double ss = 0;
        for (int i = 0; i < a->dim; i++)
            ss += (double)x[i] * x[i];
        float r = 1.0f / sqrtf((float)(ss / a->dim) + a->eps);
        for (int i = 0; i < a->dim; i++)
            o[i] = x[i] * r * a->w[i];
    }
}

/* Rotates the first rot_dim dims of each head: pair i turns by position * inv_freq[i] (the model's
 * frequency table, scaling included), and cos and sin are scaled by mscale. neox = 0: pairs
 * (2i, 2i+1), the layout GGUF files store Q/K in; neox = 1: pairs (i, i + rot_dim/2), the Hugging
 * Face layout. */
struct rope_args {
    float *q, *k; const int *positions;
    int num_tokens, num_heads, num_kv_heads, head_dim, stride;
    const float *inv_freq; int rot_dim; float mscale; int neox;
};
static void rotate(float *v, int r, const float *cosv, const float *sinv, int neox) {
    for (int i = 0; i < r / 2; i++) {
        int a = neox ? i : 2 * i, b = neox ? i + r / 2 : 2 * i + 1;
        float x = v[a], y = v[b];
        v[a] = x * cosv[i] - y * sinv[i];
        v[b] = x * sinv[i] + y * cosv[i];
    }
}
static void rope(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct rope_args *a = p;
    int d = a->head_dim, r = a->rot_dim;
    float cosv[512], sinv[512];
    simcudaAccess(a->positions, (size_t)a->num_tokens * 4, R);
    simcudaAccess(a->inv_freq, (size_t)(r / 2) * 4, R);
    for (int t = 0; t < a->num_tokens; t++) {
        simcudaAccess(a->q + (size_t)t * a->stride, (size_t)a->num_heads * d * 4, RW);
        simcudaAccess(a->k + (size_t)t * a->stride, (size_t)a->num_kv_heads * d * 4, RW);
    }
    if (r > 1024 || r > d)
        return;
    for (int t = 0; t < a->num_tokens; t++) {
        float pos = (float)a->positions[t];
        for (int i = 0; i < r / 2; i++) {
            float ang = pos * a->inv_freq[i];
            cosv[i] = cosf(ang) * a->mscale, sinv[i] = sinf(ang) * a->mscale;
        }
        for (int h = 0; h < a->num_heads; h++)
            rotate(a->q + (size_t)t * a->stride + (size_t)h * d, r, cosv, sinv, a->neox);
        for (int h = 0; h < a->num_kv_heads; h++)
            rotate(a->k + (size_t)t * a->stride + (size_t)h * d, r, cosv, sinv, a->neox);
    }
}

/* Cache layout, block-major: block b's K rows of one layer start at k_cache + b * block_stride
 * (floats), one row of num_kv_heads * head_dim per slot, slot = block * block_size + i. A block
 * holds every layer's K and V (k_cache/v_cache point at one layer's part of block 0), so pages of
 * an elastic cache hold whole blocks of all layers. */
struct cache_args {
    float *k_cache, *v_cache; const float *k, *v; const int *slots;
    int num_tokens, num_kv_heads, head_dim, stride, block_size, block_stride;
};
static size_t slot_at(int block, int i, int block_stride, size_t row) {
    return (size_t)block * (size_t)block_stride + (size_t)i * row;
}
static void reshape_and_cache(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct cache_args *a = p;
    size_t row = (size_t)a->num_kv_heads * a->head_dim;
    simcudaAccess(a->slots, (size_t)a->num_tokens * 4, R);
    for (int t = 0; t < a->num_tokens; t++) {
        if (a->slots[t] < 0)
            continue;
        size_t at = slot_at(a->slots[t] / a->block_size, a->slots[t] % a->block_size,
                            a->block_stride, row);
        simcudaAccess(a->k + (size_t)t * a->stride, row * 4, R);
        simcudaAccess(a->v + (size_t)t * a->stride, row * 4, R);
        simcudaAccess(a->k_cache + at, row * 4, W);
        simcudaAccess(a->v_cache + at, row * 4, W);
    }
    for (int t = 0; t < a->num_tokens; t++) {
        if (a->slots[t] < 0)
            continue; /* a padding token */
        size_t at = slot_at(a->slots[t] / a->block_size, a->slots[t] % a->block_size,
                            a->block_stride, row);
        memcpy(a->k_cache + at, a->k + (size_t)t * a->stride, row * 4);
        memcpy(a->v_cache + at, a->v + (size_t)t * a->stride, row * 4);
    }
}

/* Causal attention of each sequence's new tokens over its paged cache. Sequence b's queries are
 * rows query_start[b] .. query_start[b+1]-1; the last of them sits at position seq_lens[b] - 1. */
struct attn_args {
    float *out; const float *q, *k_cache, *v_cache; const int *block_tables, *seq_lens, *query_start;
    int num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_blocks, q_stride; float scale;
    int block_stride;
};
static void attend(const struct attn_args *a, int b, int qi, int pos, float *scores) {
    int d = a->head_dim, group = a->num_heads / a->num_kv_heads;
    size_t row = (size_t)a->num_kv_heads * d;
    const int *table = a->block_tables + (size_t)b * a->max_blocks;
    for (int h = 0; h < a->num_heads; h++) {
        const float *q = a->q + (size_t)qi * a->q_stride + (size_t)h * d;
        int kvh = h / group;
        float mx = -INFINITY;
        for (int j = 0; j <= pos; j++) {
            size_t at = slot_at(table[j / a->block_size], j % a->block_size, a->block_stride, row);
            const float *k = a->k_cache + at + (size_t)kvh * d;
            float s = 0;
            for (int i = 0; i < d; i++)
                s += q[i] * k[i];
            scores[j] = s * a->scale;
            mx = scores[j] > mx ? scores[j] : mx;
        }
        float sum = 0;
        for (int j = 0; j <= pos; j++)
            sum += scores[j] = expf(scores[j] - mx);
        float *o = a->out + (size_t)qi * a->num_heads * d + (size_t)h * d;
        memset(o, 0, (size_t)d * 4);
        for (int j = 0; j <= pos; j++) {
            size_t at = slot_at(table[j / a->block_size], j % a->block_size, a->block_stride, row);
            const float *v = a->v_cache + at + (size_t)kvh * d;
            float w = scores[j] / sum;
            for (int i = 0; i < d; i++)
                o[i] += w * v[i];
        }
    }
}
/* What one sequence's attention reads: its queries, its blocks' K and V rows; writes: its out. */
static void attention_accesses(const struct attn_args *a, int b) {
    int q0 = a->query_start[b], q1 = a->query_start[b + 1], len = a->seq_lens[b];
    size_t row = (size_t)a->num_kv_heads * a->head_dim, q = (size_t)a->num_heads * a->head_dim;
    if (q1 > q0) {
        simcudaAccess(a->q + (size_t)q0 * a->q_stride, ((size_t)(q1 - q0 - 1) * a->q_stride + q) * 4, R);
        simcudaAccess(a->out + (size_t)q0 * q, (size_t)(q1 - q0) * q * 4, W);
    }
    const int *table = a->block_tables + (size_t)b * a->max_blocks;
    for (int j = 0; j < len && j / a->block_size < a->max_blocks; j += a->block_size) {
        int n = len - j < a->block_size ? len - j : a->block_size;
        size_t at = slot_at(table[j / a->block_size], 0, a->block_stride, row);
        simcudaAccess(a->k_cache + at, (size_t)n * row * 4, R);
        simcudaAccess(a->v_cache + at, (size_t)n * row * 4, R);
    }
}

static void paged_attention(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct attn_args *a = p;
    simcudaAccess(a->query_start, (size_t)(a->num_seqs + 1) * 4, R);
    simcudaAccess(a->seq_lens, (size_t)a->num_seqs * 4, R);
    simcudaAccess(a->block_tables, (size_t)a->num_seqs * a->max_blocks * 4, R);
    for (int b = 0; b < a->num_seqs; b++)
        attention_accesses(a, b);
    float *scores = malloc((size_t)a->max_blocks * a->block_size * sizeof(float));
    for (int b = 0; scores && b < a->num_seqs; b++) {
        int q0 = a->query_start[b], q1 = a->query_start[b + 1], len = a->seq_lens[b];
        for (int qi = q0; qi < q1; qi++) {
            int pos = len - (q1 - qi);
            if (pos < 0) { /* a padding row */
                memset(a->out + (size_t)qi * a->num_heads * a->head_dim, 0,
                       (size_t)a->num_heads * a->head_dim * 4);
                continue;
            }
            attend(a, b, qi, pos, scores);
        }
    }
    free(scores);
}

struct silu_args { float *out; const float *gate_up; int num_tokens, dim; };
static void silu_and_mul(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct silu_args *a = p;
    simcudaAccess(a->gate_up, (size_t)a->num_tokens * 2 * a->dim * 4, R);
    simcudaAccess(a->out, (size_t)a->num_tokens * a->dim * 4, W);
    for (int t = 0; t < a->num_tokens; t++) {
        const float *g = a->gate_up + (size_t)t * 2 * a->dim, *u = g + a->dim;
        float *o = a->out + (size_t)t * a->dim;
        for (int i = 0; i < a->dim; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

struct bias_args { float *x; const float *bias; int num_tokens, dim; };
static void add_bias(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct bias_args *a = p;
    simcudaAccess(a->bias, (size_t)a->dim * 4, R);
    simcudaAccess(a->x, (size_t)a->num_tokens * a->dim * 4, RW);
    for (int t = 0; t < a->num_tokens; t++)
        for (int i = 0; i < a->dim; i++)
            a->x[(size_t)t * a->dim + i] += a->bias[i];
}

struct add_args { float *x; const float *y; int n; };
static void add_inplace(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct add_args *a = p;
    simcudaAccess(a->y, (size_t)a->n * 4, R);
    simcudaAccess(a->x, (size_t)a->n * 4, RW);
    for (int i = 0; i < a->n; i++)
        a->x[i] += a->y[i];
}

struct gather_args { float *out; const float *in; const int *rows; int num_rows, dim; };
static void gather_rows(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct gather_args *a = p;
    simcudaAccess(a->rows, (size_t)a->num_rows * 4, R);
    simcudaAccess(a->out, (size_t)a->num_rows * a->dim * 4, W);
    for (int r = 0; r < a->num_rows; r++)
        simcudaAccess(a->in + (size_t)a->rows[r] * a->dim, (size_t)a->dim * 4, R);
    for (int r = 0; r < a->num_rows; r++)
        memcpy(a->out + (size_t)r * a->dim, a->in + (size_t)a->rows[r] * a->dim, (size_t)a->dim * 4);
}

void engine_sample_tokens(const simcuda_kctx *ctx, const void *p); /* engine_sample.c */

SIMCUDA_STUB(embed_tokens)
SIMCUDA_STUB(rms_norm_kernel)
SIMCUDA_STUB(rotary_embedding)
SIMCUDA_STUB(reshape_and_cache_kernel)
SIMCUDA_STUB(paged_attention_kernel)
SIMCUDA_STUB(silu_and_mul_kernel)
SIMCUDA_STUB(add_bias_kernel)
SIMCUDA_STUB(add_inplace_kernel)
SIMCUDA_STUB(gather_rows_kernel)
SIMCUDA_STUB(sample_tokens_kernel)

static const simcuda_kernel_desc kernels[] = {
    {"embed_tokens", "p p p i i", embed, embed_tokens},
    {"rms_norm_kernel", "p p p i i f", rms_norm, rms_norm_kernel},
    {"rotary_embedding", "p p p i i i i i p i f i", rope, rotary_embedding},
    {"reshape_and_cache_kernel", "p p p p p i i i i i i", reshape_and_cache,
     reshape_and_cache_kernel},
    {"paged_attention_kernel", "p p p p p p p i i i i i i i f i", paged_attention,
     paged_attention_kernel},
    {"silu_and_mul_kernel", "p p i i", silu_and_mul, silu_and_mul_kernel},
    {"add_bias_kernel", "p p i i", add_bias, add_bias_kernel},
    {"add_inplace_kernel", "p p i", add_inplace, add_inplace_kernel},
    {"gather_rows_kernel", "p p p i i", gather_rows, gather_rows_kernel},
    {"sample_tokens_kernel", "p p p p p i i", engine_sample_tokens, sample_tokens_kernel},
};

SIMCUDA_MODULE(medusa_engine, kernels, NULL, 0)
