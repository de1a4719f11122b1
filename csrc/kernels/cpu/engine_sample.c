/* The reference engine's sampling kernel on simcuda (engine.c registers it): greedy at
 * temperature 0, else temperature + top-p from a counter-based RNG. Same contract as
 * csrc/kernels/cuda/engine.cu. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simcuda/simcuda.h"

void engine_sample_tokens(const simcuda_kctx *ctx, const void *p);

static uint64_t mix(uint64_t x) { /* splitmix64 finalizer */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int by_desc(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a < b) - (a > b);
}

/* NOTE: the nucleus is every token whose probability reaches the threshold the sorted cumulative
 * sum gives, and sampling walks the vocabulary in index order: the GPU kernel does the same, so
 * both pick the same token for the same seed. */
static int sample_row(const float *logits, int vocab, float temp, float top_p, uint64_t seed,
                      float *probs, float *sorted) {
    int best = 0;
    for (int i = 1; i < vocab; i++)
        best = logits[i] > logits[best] ? i : best;
    if (temp <= 0.0f)
        return best;
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        sum += probs[i] = expf((logits[i] - logits[best]) / temp);
    float threshold = 0.0f;
    if (top_p < 1.0f) {
        memcpy(sorted, probs, (size_t)vocab * sizeof *sorted);
        qsort(sorted, (size_t)vocab, sizeof *sorted, by_desc);
        double c = 0;
        for (int n = 0; n < vocab && c < top_p * sum; n++)
            c += threshold = sorted[n];
        sum = 0;
        for (int i = 0; i < vocab; i++)
            sum += probs[i] >= threshold ? probs[i] : 0.0f;
    }
    double target = (double)(mix(seed) >> 11) * 0x1.0p-53 * sum, acc = 0;
    int last = best;
    for (int i = 0; i < vocab; i++) {
        if (probs[i] < threshold)
            continue;
        acc += probs[i];
        last = i;
        if (acc > target)
            return i;
    }
    return last;
}

struct sample_args {
    int *out; const float *logits, *temperature, *top_p; const uint64_t *seeds; int num_seqs, vocab;
};
void engine_sample_tokens(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct sample_args *a = p;
    simcudaAccess(a->logits, (size_t)a->num_seqs * a->vocab * 4, SIMCUDA_READ);
    simcudaAccess(a->temperature, (size_t)a->num_seqs * 4, SIMCUDA_READ);
    simcudaAccess(a->top_p, (size_t)a->num_seqs * 4, SIMCUDA_READ);
    simcudaAccess(a->seeds, (size_t)a->num_seqs * 8, SIMCUDA_READ);
    simcudaAccess(a->out, (size_t)a->num_seqs * 4, SIMCUDA_WRITE);
    float *probs = malloc((size_t)a->vocab * sizeof(float));
    float *sorted = malloc((size_t)a->vocab * sizeof(float));
    for (int b = 0; probs && sorted && b < a->num_seqs; b++)
        a->out[b] = sample_row(a->logits + (size_t)b * a->vocab, a->vocab, a->temperature[b],
                               a->top_p[b], a->seeds[b], probs, sorted);
    free(probs);
    free(sorted);
}
