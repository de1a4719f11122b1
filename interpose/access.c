/* ACCESS records: what memory a kernel run read and wrote, as reported by an instrumented back-end
 * (simcuda under MEDUSA_SIM_ACCESSES=1; a PTX-instrumented kernel's read-back on a GPU). The
 * recorder only writes what it is told: it never instruments anything itself. */
#include "internal.h"

#define U(x) ((uint64_t)(uintptr_t)(x))

MI_EXPORT void medusa_trace_access(const void *func, const void *node, const uint64_t *extents,
                                   size_t num_extents, uint64_t granularity, uint64_t flags) {
    if (!mi_wants(F_LAUNCH) || (num_extents && !extents) || num_extents > (1u << 26))
        return;
    medusa_trace_record r = {.type = MEDUSA_EV_ACCESS,
                             .u = {U(func), U(node), num_extents, granularity, flags}};
    mi_emit(&r, extents, num_extents * 3 * sizeof *extents, LIVE_NONE);
}
