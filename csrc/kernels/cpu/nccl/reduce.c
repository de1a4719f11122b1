/* Element-wise reduction of the ranks' slots, in rank order (the same order on every rank, so
 * every rank's result is bit-identical). Half types are widened to float, combined in rank order
 * and rounded once (NCCL combines in the element type: results may differ from NCCL's in the
 * last bit, never between ranks). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "medusa/nccl_api.h"

size_t mnccl_type_size(int t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
    }
}

static float bf16_to_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); /* round to nearest even */
}

static double combine(double acc, double x, int op) {
    switch (op) {
    case ncclProd: return acc * x;
    case ncclMax: return x > acc ? x : acc;
    case ncclMin: return x < acc ? x : acc;
    default: return acc + x; /* ncclSum, ncclAvg */
    }
}

#define REDUCE_AS(T, LOAD, STORE)                                                                  \
    for (size_t i = 0; i < count; i++) {                                                           \
        double acc = LOAD(((const T *)src[0])[i]);                                                 \
        for (int r = 1; r < n; r++)                                                                \
            acc = combine(acc, LOAD(((const T *)src[r])[i]), op);                                 \
        if (op == ncclAvg)                                                                         \
            acc /= n;                                                                              \
        ((T *)dst)[i] = STORE(acc);                                                                \
    }

#define SAME(x) (x)
#define F16_LOAD(x) ((double)(x))
#define F16_STORE(x) ((_Float16)(float)(x))
#define BF_LOAD(x) ((double)bf16_to_f(x))
#define BF_STORE(x) (f_to_bf16((float)(x)))

/* Integer types combine in their own type, sums and products wrapping (computed unsigned:
 * signed overflow is undefined in C). */
#define REDUCE_INT(T, U)                                                                           \
    for (size_t i = 0; i < count; i++) {                                                           \
        T acc = ((const T *)src[0])[i];                                                            \
        for (int r = 1; r < n; r++) {                                                              \
            T x = ((const T *)src[r])[i];                                                          \
            acc = op == ncclProd  ? (T)((U)acc * (U)x)                                             \
                  : op == ncclMax ? (x > acc ? x : acc)                                            \
                  : op == ncclMin ? (x < acc ? x : acc)                                            \
                                  : (T)((U)acc + (U)x);                                            \
        }                                                                                          \
        ((T *)dst)[i] = op == ncclAvg ? (T)(acc / (T)n) : acc;                                     \
    }

/* Floats accumulate in float for float32 (as NCCL does), in double for float64. */
#define REDUCE_F32()                                                                               \
    for (size_t i = 0; i < count; i++) {                                                           \
        float acc = ((const float *)src[0])[i];                                                    \
        for (int r = 1; r < n; r++)                                                                \
            acc = (float)combine(acc, ((const float *)src[r])[i], op);                            \
        ((float *)dst)[i] = op == ncclAvg ? acc / (float)n : acc;                                  \
    }

void mnccl_reduce(void *dst, const uint8_t *const *src, int n, size_t count, int type, int op) {
    switch (type) {
    case ncclInt8: REDUCE_INT(int8_t, uint32_t) break;
    case ncclUint8: REDUCE_INT(uint8_t, uint32_t) break;
    case ncclInt32: REDUCE_INT(int32_t, uint32_t) break;
    case ncclUint32: REDUCE_INT(uint32_t, uint32_t) break;
    case ncclInt64: REDUCE_INT(int64_t, uint64_t) break;
    case ncclUint64: REDUCE_INT(uint64_t, uint64_t) break;
    case ncclFloat32: REDUCE_F32() break;
    case ncclFloat64: REDUCE_AS(double, SAME, SAME) break;
    case ncclFloat16: REDUCE_AS(_Float16, F16_LOAD, F16_STORE) break;
    case ncclBfloat16: REDUCE_AS(uint16_t, BF_LOAD, BF_STORE) break;
    default: break;
    }
}
