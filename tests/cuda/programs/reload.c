/* Loads a saved module image in a fresh process, finds the kernel by enumeration and runs it. */
#include "common.h"

int main(int argc, char **argv) {
    CHECK(cuInit(0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    if (argc > 2) { /* corrupt the image first */
        FILE *fp = fopen(argv[1], "r+b");
        fseek(fp, 40, SEEK_SET);
        fputc(0xff, fp);
        fputc(0xff, fp);
        fclose(fp);
    }
    CUmodule mod;
    CUresult r = cuModuleLoad(&mod, argv[1]);
    SHOW("load", r);
    if (r)
        return 0;
    unsigned count;
    CHECK(cuModuleGetFunctionCount(&count, mod));
    CUfunction f;
    CHECK(cuModuleEnumerateFunctions(&f, 1, mod));
    const char *name;
    CHECK(cuFuncGetName(&name, f));
    CUdeviceptr a, c;
    float ha[4] = {1, 2, 3, 4}, hc[4];
    CHECK(cuMemAlloc(&a, 16));
    CHECK(cuMemAlloc(&c, 16));
    CHECK(cuMemcpyHtoD(a, ha, 16));
    int m = 2, n = 2, k = 2;
    void *args[] = {&m, &n, &k, &a, &a, &c};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
    CHECK(cuMemcpyDtoH(hc, c, 16));
    printf("reloaded %s: %g %g %g %g\n", name, hc[0], hc[1], hc[2], hc[3]);
    return 0;
}
