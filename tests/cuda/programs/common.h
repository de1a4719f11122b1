#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* stdout line-buffered even into a file or pipe, so a program that crashes keeps every line it
 * printed before (scripts/gpu/simcuda_parity.sh names the last one). */
__attribute__((constructor)) static void line_buffered_stdout(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
}

/* Prints "name: cudaErrorX" so tests can assert on exact error names. */
#define SHOW(label, x) printf("%s: %s\n", label, cudaGetErrorName((cudaError_t)(x)))
#define CHECK(x)                                                                                   \
    do {                                                                                           \
        int e_ = (int)(x);                                                                         \
        if (e_) {                                                                                  \
            printf("FAIL %s -> %s\n", #x, cudaGetErrorName((cudaError_t)e_));                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
