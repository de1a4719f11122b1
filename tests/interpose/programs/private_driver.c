/* Loads the driver privately, as libcudart does (dlopen, RTLD_LOCAL), then reaches an allocation
 * entry point by its global name: only the preloaded recorder exports it, and RTLD_NEXT cannot see
 * the driver behind it. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    void *drv = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
    CUresult (*init)(unsigned) = drv ? (CUresult(*)(unsigned))dlsym(drv, "cuInit") : NULL;
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    if (!init || !alloc) {
        printf("lookup: failed\n");
        return 1;
    }
    CUdeviceptr p = 0;
    printf("init: %d\n", (int)init(0));
    printf("alloc: %d\n", (int)alloc(&p, 4096));
    return 0;
}
