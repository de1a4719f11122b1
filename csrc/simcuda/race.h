/* The race checker's shared pieces (race.c: clocks and history; race_report.c: messages and
 * kernels' accesses). */
#ifndef SIMCUDA_RACE_H
#define SIMCUDA_RACE_H

#include "exec.h"

typedef struct {
    sim_op *op; /* held */
    int32_t node;
} who_t;

/* Fails the context with a message naming both accesses, their streams and the bytes. */
CUresult sim_race_report(who_t now, int now_mode, who_t then, int then_mode, uintptr_t lo,
                         uintptr_t hi);

uint64_t sim_vc_at(const sim_vc *vc, uint32_t i);
uint64_t sim_clock_at(const sim_clock *c, uint32_t i); /* c's entry for race index i */

/* The block holding p (device allocation, module global, VMM mapping, pinned host range). */
bool sim_race_block_of(uintptr_t p, uintptr_t *lo, uintptr_t *hi);

#endif
