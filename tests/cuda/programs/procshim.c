/* A test preload: exports dlsym, hands out a wrapped cuGetProcAddress, and counts which driver
 * launch variants the runtime reached through it; saves every library image it sees. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *(*real_dlsym)(void *, const char *);
static PFN_cuGetProcAddress_v12000 real_gpa;
static PFN_cuLaunchKernel_v4000 real_launch, real_launch_ptsz;
static PFN_cuLibraryLoadData_v12000 real_libload;
static int n_launch, n_launch_ptsz, n_libs;

static CUresult launch(CUfunction f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g,
                       unsigned s, CUstream st, void **p, void **x) {
    n_launch++;
    return real_launch(f, a, b, c, d, e, g, s, st, p, x);
}
static CUresult launch_ptsz(CUfunction f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e,
                            unsigned g, unsigned s, CUstream st, void **p, void **x) {
    n_launch_ptsz++;
    return real_launch_ptsz(f, a, b, c, d, e, g, s, st, p, x);
}
static CUresult libload(CUlibrary *l, const void *code, CUjit_option *a, void **b, unsigned c,
                        CUlibraryOption *d, void **e, unsigned f) {
    fprintf(stderr, "shim: cuLibraryLoadData #%d\n", n_libs);
    const char *dir = getenv("SHIM_SAVE_DIR");
    const void *image = code;
    uint32_t magic;
    memcpy(&magic, code, 4);
    if (magic == 0x466243b1u) /* the runtime's fatbin wrapper: {magic, version, image, ...} */
        memcpy(&image, (const char *)code + 8, sizeof image);
    if (dir) {
        char path[512];
        uint64_t size;
        memcpy(&size, (const char *)image + 16, 8);
        snprintf(path, sizeof path, "%s/image_%d.bin", dir, n_libs);
        FILE *fp = fopen(path, "wb");
        fwrite(image, 1, size, fp);
        fclose(fp);
    }
    n_libs++;
    return real_libload(l, code, a, b, c, d, e, f);
}

static CUresult gpa(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st) {
    CUresult r = real_gpa(sym, pfn, ver, flags, st);
    if (r || !*pfn)
        return r;
    if (!strcmp(sym, "cuLaunchKernel")) {
        int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
        /* identify the variant by pointer, as the real interposer will */
        void *legacy = real_dlsym(RTLD_DEFAULT, "cuLaunchKernel");
        ptsz = *pfn != legacy;
        if (ptsz) { real_launch_ptsz = *pfn; *pfn = (void *)launch_ptsz; }
        else { real_launch = *pfn; *pfn = (void *)launch; }
    } else if (!strcmp(sym, "cuLibraryLoadData")) {
        real_libload = *pfn;
        *pfn = (void *)libload;
    }
    return r;
}

__attribute__((visibility("default"))) void *dlsym(void *h, const char *name) {
    if (!real_dlsym) {
        real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!real_dlsym)
            real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    }
    if (!strcmp(name, "cuGetProcAddress_v2")) {
        real_gpa = real_dlsym(h, name);
        return (void *)gpa;
    }
    return real_dlsym(h, name);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "shim: cuLaunchKernel=%d cuLaunchKernel_ptsz=%d libraries=%d\n", n_launch, n_launch_ptsz, n_libs);
}
