// The reference engine's kernels for a GPU: the same names and parameters as
// csrc/kernels/cpu/engine.c. Every kernel loops grid-stride, so any launch geometry is correct.
// NOTE: nvcc 13 hides __global__ host stubs by default; the engine finds kernels by name (dlsym).
#define KERNEL extern "C" __global__ __attribute__((visibility("default")))
#include <cstdint>

#define GRID_STRIDE(i, n) for (int i = blockIdx.x; i < (n); i += gridDim.x)
#define BLOCK_STRIDE(i, n) for (int i = threadIdx.x; i < (n); i += blockDim.x)

KERNEL void embed_tokens(float *out, const float *table, const int *ids,
                                        int num_tokens, int dim) {
    GRID_STRIDE(t, num_tokens) {
        BLOCK_STRIDE(i, dim) out[(size_t)t * dim + i] = table[(size_t)ids[t] * dim + i];
    }
}

static __device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < (int)(blockDim.x + 31) / 32; w++)
        s += part[w];
    return s;
}

KERNEL void rms_norm_kernel(float *out, const float *x, const float *w,
                                           int num_tokens, int dim, float eps) {
    GRID_STRIDE(t, num_tokens) {
        const float *row = x + (size_t)t * dim;
        float ss = 0.0f;
        BLOCK_STRIDE(i, dim) ss += row[i] * row[i];
        float r = rsqrtf(block_sum(ss) / dim + eps);
        BLOCK_STRIDE(i, dim) out[(size_t)t * dim + i] = row[i] * r * w[i];
    }
}

// Rotates the first rot_dim dims of each head by position * inv_freq[i], cos and sin scaled by
// mscale; neox = 0: pairs (2i, 2i+1) (GGUF), neox = 1: pairs (i, i + rot_dim/2) (Hugging Face).
KERNEL void rotary_embedding(float *q, float *k, const int *positions,
                                            int num_tokens, int num_heads, int num_kv_heads,
                                            int head_dim, int stride, const float *inv_freq,
                                            int rot_dim, float mscale, int neox) {
    int half = rot_dim / 2;
    GRID_STRIDE(t, num_tokens) {
        BLOCK_STRIDE(j, (num_heads + num_kv_heads) * half) {
            int h = j / half, i = j % half;
            float *v = h < num_heads ? q + (size_t)t * stride + (size_t)h * head_dim
                                     : k + (size_t)t * stride + (size_t)(h - num_heads) * head_dim;
            float ang = positions[t] * inv_freq[i], c, s;
            sincosf(ang, &s, &c);
            c *= mscale, s *= mscale;
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float x = v[a], y = v[b];
            v[a] = x * c - y * s;
            v[b] = x * s + y * c;
        }
    }
}

// Block-major cache: block b's rows of one layer start at cache + b * block_stride (floats); the
// cache pointers are one layer's K or V part of block 0 (csrc/kernels/cpu/engine.c says why).
KERNEL void reshape_and_cache_kernel(float *k_cache, float *v_cache, const float *k,
                                                    const float *v, const int *slots,
                                                    int num_tokens, int num_kv_heads, int head_dim,
                                                    int stride, int block_size, int block_stride) {
    int row = num_kv_heads * head_dim;
    GRID_STRIDE(t, num_tokens) {
        if (slots[t] < 0)
            continue;
        size_t at = (size_t)(slots[t] / block_size) * block_stride +
                    (size_t)(slots[t] % block_size) * row;
        BLOCK_STRIDE(i, row) {
            k_cache[at + i] = k[(size_t)t * stride + i];
            v_cache[at + i] = v[(size_t)t * stride + i];
        }
    }
}

// One thread per (query row, head), online softmax over the paged cache.
KERNEL void paged_attention_kernel(
    float *out, const float *q, const float *k_cache, const float *v_cache, const int *block_tables,
    const int *seq_lens, const int *query_start, int num_seqs, int num_heads, int num_kv_heads,
    int head_dim, int block_size, int max_blocks, int q_stride, float scale, int block_stride) {
    int rows = query_start[num_seqs] * num_heads, group = num_heads / num_kv_heads;
    int kv_row = num_kv_heads * head_dim;
    for (int w = blockIdx.x * blockDim.x + threadIdx.x; w < rows; w += gridDim.x * blockDim.x) {
        int qi = w / num_heads, h = w % num_heads, b = 0;
        while (b + 1 < num_seqs && query_start[b + 1] <= qi)
            b++;
        int pos = seq_lens[b] - (query_start[b + 1] - qi);
        float *o = out + (size_t)qi * num_heads * head_dim + (size_t)h * head_dim;
        for (int i = 0; i < head_dim; i++)
            o[i] = 0.0f;
        const float *qv = q + (size_t)qi * q_stride + (size_t)h * head_dim;
        const int *table = block_tables + (size_t)b * max_blocks;
        float m = -INFINITY, l = 0.0f;
        for (int j = 0; j <= pos; j++) {
            size_t at = (size_t)table[j / block_size] * block_stride +
                        (size_t)(j % block_size) * kv_row + (size_t)(h / group) * head_dim;
            const float *kv = k_cache + at;
            const float *vv = v_cache + at;
            float s = 0.0f;
            for (int i = 0; i < head_dim; i++)
                s += qv[i] * kv[i];
            s *= scale;
            float mn = fmaxf(m, s), corr = __expf(m - mn), p = __expf(s - mn);
            l = l * corr + p;
            for (int i = 0; i < head_dim; i++)
                o[i] = o[i] * corr + p * vv[i];
            m = mn;
        }
        for (int i = 0; pos >= 0 && i < head_dim; i++)
            o[i] /= l;
    }
}

KERNEL void silu_and_mul_kernel(float *out, const float *gate_up, int num_tokens,
                                               int dim) {
    GRID_STRIDE(t, num_tokens) {
        BLOCK_STRIDE(i, dim) {
            float g = gate_up[(size_t)t * 2 * dim + i], u = gate_up[(size_t)t * 2 * dim + dim + i];
            out[(size_t)t * dim + i] = g / (1.0f + __expf(-g)) * u;
        }
    }
}

KERNEL void add_bias_kernel(float *x, const float *bias, int num_tokens, int dim) {
    GRID_STRIDE(t, num_tokens) { BLOCK_STRIDE(i, dim) x[(size_t)t * dim + i] += bias[i]; }
}

KERNEL void add_inplace_kernel(float *x, const float *y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] += y[i];
}

KERNEL void gather_rows_kernel(float *out, const float *in, const int *rows,
                                              int num_rows, int dim) {
    GRID_STRIDE(r, num_rows) {
        BLOCK_STRIDE(i, dim) out[(size_t)r * dim + i] = in[(size_t)rows[r] * dim + i];
    }
}

static __device__ uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// One block per row; thread 0 walks the vocabulary (the nucleus threshold found by bisection on
// the probability mass), so the choice matches the CPU kernel's for the same seed.
KERNEL void sample_tokens_kernel(int *out, const float *logits,
                                                const float *temperature, const float *top_p,
                                                const uint64_t *seeds, int num_seqs, int vocab) {
    GRID_STRIDE(b, num_seqs) {
        if (threadIdx.x != 0)
            continue;
        const float *x = logits + (size_t)b * vocab;
        int best = 0;
        for (int i = 1; i < vocab; i++)
            best = x[i] > x[best] ? i : best;
        float t = temperature[b];
        if (t <= 0.0f) {
            out[b] = best;
            continue;
        }
        double sum = 0.0;
        for (int i = 0; i < vocab; i++)
            sum += __expf((x[i] - x[best]) / t);
        float lo = 0.0f, hi = 1.0f;  // probabilities relative to the best token's
        if (top_p[b] < 1.0f)
            for (int it = 0; it < 40; it++) {
                float mid = 0.5f * (lo + hi);
                double mass = 0.0;
                for (int i = 0; i < vocab; i++) {
                    float p = __expf((x[i] - x[best]) / t);
                    mass += p >= mid ? p : 0.0f;
                }
                if (mass >= top_p[b] * sum) lo = mid; else hi = mid;
            }
        float threshold = top_p[b] < 1.0f ? lo : 0.0f;
        double kept = 0.0;
        for (int i = 0; i < vocab; i++) {
            float p = __expf((x[i] - x[best]) / t);
            kept += p >= threshold ? p : 0.0f;
        }
        double target = (double)(mix(seeds[b]) >> 11) * 0x1.0p-53 * kept, acc = 0.0;
        int pick = best;
        for (int i = 0; i < vocab; i++) {
            float p = __expf((x[i] - x[best]) / t);
            if (p < threshold)
                continue;
            acc += p;
            pick = i;
            if (acc > target)
                break;
        }
        out[b] = pick;
    }
}
