/* Error names and messages, with the name tables generated from the CUDA headers at build time. */
#include <stddef.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "internal.h"

typedef struct {
    int code;
    const char *name;
} err_name;

static const err_name cu_names[] = {
#include "cu_error_names.inc"
};
static const err_name rt_names[] = {
#include "rt_error_names.inc"
};

static const struct {
    int code;
    const char *msg;
} messages[] = {
    {0, "no error"},
    {1, "invalid argument"},
    {2, "out of memory"},
    {3, "initialization error"},
    {9, "invalid configuration argument"},
    {98, "invalid device function"},
    {100, "no CUDA-capable device is detected"},
    {101, "invalid device ordinal"},
    {200, "device kernel image is invalid"},
    {201, "invalid device context"},
    {209, "no kernel image is available for execution on the device"},
    {218, "a PTX JIT compilation failed"},
    {400, "invalid resource handle"},
    {401, "the requested resource is an illegal state"},
    {500, "named symbol not found"},
    {600, "device not ready"},
    {700, "an illegal memory access was encountered"},
    {701, "too many resources requested for launch"},
    {719, "unspecified launch failure"},
    {800, "operation not permitted"},
    {801, "operation not supported"},
    {900, "operation not permitted when stream is capturing"},
    {901, "operation failed due to a previous error during capture"},
    {902, "operation would result in a merge of separate capture sequences"},
    {903, "capture was not ended in the same stream as it began"},
    {904, "capturing stream has unjoined work"},
    {905, "dependency created on uncaptured work in another stream"},
    {906, "operation would make the legacy stream depend on a capturing blocking stream"},
    {907, "operation not permitted on an event last recorded in a capturing stream"},
    {908, "attempt to terminate a thread-local capture sequence from another thread"},
    {910, "the graph update was not performed because it included changes which violated constraints "
          "specific to instantiated graph update"},
    {999, "unknown error"},
};

static const char *find_name(const err_name *t, size_t n, int code) {
    for (size_t i = 0; i < n; i++)
        if (t[i].code == code)
            return t[i].name;
    return NULL;
}

static const char *find_message(int code) {
    for (size_t i = 0; i < sizeof messages / sizeof messages[0]; i++)
        if (messages[i].code == code)
            return messages[i].msg;
    return NULL;
}

SIM_API CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = find_name(cu_names, sizeof cu_names / sizeof cu_names[0], (int)error);
    return *pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = find_message((int)error);
    if (!*pStr)
        *pStr = find_name(cu_names, sizeof cu_names / sizeof cu_names[0], (int)error);
    return *pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API const char *cudaGetErrorName(cudaError_t error) {
    const char *n = find_name(rt_names, sizeof rt_names / sizeof rt_names[0], (int)error);
    return n ? n : "cudaErrorUnknown";
}

SIM_API const char *cudaGetErrorString(cudaError_t error) {
    const char *m = find_message((int)error);
    return m ? m : cudaGetErrorName(error);
}
