/* The five-argument cuGraphInstantiate of CUDA 10.0 (v1) and 11.0 (_v2): what cuGetProcAddress
 * asked for "cuGraphInstantiate" hands out, up to CUDA 13 (cuda.h's cuGraphInstantiate is another
 * function, cuGraphInstantiateWithFlags). An error node is never named; the log says what failed. */
#include <stdio.h>

#include "internal.h"

#undef cuGraphInstantiate

static CUresult instantiate(CUgraphExec *exec, CUgraph g, CUgraphNode *err, char *log, size_t n) {
    CUresult e = cuGraphInstantiateWithFlags(exec, g, 0);
    if (err)
        *err = NULL;
    if (log && n) {
        const char *name = NULL;
        if (e != CUDA_SUCCESS)
            cuGetErrorName(e, &name);
        snprintf(log, n, "%s", name ? name : "");
    }
    return e;
}

SIM_API CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph g, CUgraphNode *err, char *log,
                                    size_t n) {
    return instantiate(exec, g, err, log, n);
}

SIM_API CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph g, CUgraphNode *err, char *log,
                                       size_t n) {
    return instantiate(exec, g, err, log, n);
}
