/* Module and library loads (image hash, image bytes saved once), globals, function attributes. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define U(x) ((uint64_t)(uintptr_t)(x))
#define MAX_IMAGE ((size_t)1 << 31)

/* The image a fatbin wrapper (__fatBinC_Wrapper_t: {magic, version, data, filename}) points to, or
 * image itself. NOTE: hash and save what it points to: the wrapper holds a per-run pointer. */
const void *mi_image_data(const void *image) {
    const unsigned char *p = image;
    uint32_t magic;
    const void *data = NULL;
    if (!p)
        return NULL;
    memcpy(&magic, p, 4);
    if (magic != 0x466243b1u)
        return image;
    memcpy(&data, p + 8, sizeof data);
    return data;
}

/* The size of an image handed over by pointer: the driver is told none, so read the format. */
size_t mi_image_size(const void *image) {
    const unsigned char *p = image;
    if (!p)
        return 0;
    uint32_t magic;
    memcpy(&magic, p, 4);
    if (memcmp(p, "SIMCUBIN", 8) == 0) {
        uint64_t total;
        memcpy(&total, p + 16, 8);
        return total <= MAX_IMAGE ? (size_t)total : 0;
    }
    if (magic == 0xBA55ED50u) { /* fatbin: u16 header size @6, u64 body size @8 */
        uint16_t h;
        uint64_t body;
        memcpy(&h, p + 6, 2);
        memcpy(&body, p + 8, 8);
        return h + body <= MAX_IMAGE ? (size_t)(h + body) : 0;
    }
    if (memcmp(p, "\x7f" "ELF", 4) == 0 && p[4] == 2) { /* ELF64: the furthest table ends it */
        uint64_t phoff, shoff;
        uint16_t phentsize, phnum, shentsize, shnum;
        memcpy(&phoff, p + 0x20, 8), memcpy(&shoff, p + 0x28, 8);
        memcpy(&phentsize, p + 0x36, 2), memcpy(&phnum, p + 0x38, 2);
        memcpy(&shentsize, p + 0x3a, 2), memcpy(&shnum, p + 0x3c, 2);
        uint64_t a = phoff + (uint64_t)phentsize * phnum, b = shoff + (uint64_t)shentsize * shnum;
        uint64_t end = a > b ? a : b;
        return end <= MAX_IMAGE ? (size_t)end : 0;
    }
    /* PTX (or any text): up to the terminating NUL. */
    size_t n = strnlen((const char *)p, MAX_IMAGE);
    return n < MAX_IMAGE && n ? n + 1 : 0;
}

static void *read_file(const char *fname, size_t *size) {
    FILE *fp = fname ? fopen(fname, "rb") : NULL;
    if (!fp)
        return NULL;
    void *data = NULL;
    if (fseek(fp, 0, SEEK_END) == 0) {
        long n = ftell(fp);
        rewind(fp);
        data = n > 0 ? malloc((size_t)n) : NULL;
        if (data && fread(data, 1, (size_t)n, fp) != (size_t)n) {
            free(data);
            data = NULL;
        }
        *size = data ? (size_t)n : 0;
    }
    fclose(fp);
    return data;
}

typedef struct {
    unsigned num;
    const int *opts;
    void *const *vals;
} options;

/* LOAD blob: u32 jit count, u32 library-option count, then (u32 option, u32 0, u64 value) each,
 * then the file name (cuModuleLoad, cuLibraryLoadFromFile). */
static void rec_load(hook_id api, int res, const void *handle, bool is_library, const void *image,
                     size_t size, const char *fname, options jit, options lib) {
    /* A library's module (cuLibraryGetModule) is its own handle: recorded with it, so what is
     * found through the module (cuFuncGetModule, cuModuleGetGlobal) keeps the image hash. */
    const mi_driver *d = mi_drv();
    CUmodule mod = NULL;
    if (!res && is_library && handle && d->libraryGetModule &&
        d->libraryGetModule(&mod, (CUlibrary)handle) != CUDA_SUCCESS)
        mod = NULL;
    medusa_trace_record r = {.type = MEDUSA_EV_LOAD, .api = (uint16_t)api, .result = res,
                             .u = {U(handle), size, is_library, [7] = U(mod)}};
    uint8_t hash[32] = {0};
    char hex[65] = {0};
    if (!res && image && size) {
        mi_sha256(image, size, hash);
        for (int i = 0; i < 32; i++)
            snprintf(hex + 2 * i, 3, "%02x", hash[i]);
    } else if (!res) {
        mi_log("a module image of unknown format was loaded; its bytes are not saved");
    }
    memcpy(&r.u[3], hash, 32);
    size_t nl = fname ? strlen(fname) : 0, n = 8 + 16 * (size_t)(jit.num + lib.num) + nl;
    unsigned char *blob = malloc(n);
    if (!blob) {
        mi_emit(&r, NULL, 0, LIVE_NONE);
        if (hex[0])
            mi_save_image(hex, image, size);
        return;
    }
    uint32_t counts[2] = {jit.num, lib.num};
    memcpy(blob, counts, 8);
    unsigned char *o = blob + 8;
    const options *sets[2] = {&jit, &lib};
    for (int s = 0; s < 2; s++)
        for (unsigned i = 0; i < sets[s]->num; i++, o += 16) {
            uint32_t opt[2] = {(uint32_t)sets[s]->opts[i], 0};
            uint64_t v = sets[s]->vals ? U(sets[s]->vals[i]) : 0;
            memcpy(o, opt, 8), memcpy(o + 8, &v, 8);
        }
    if (nl)
        memcpy(o, fname, nl);
    mi_emit(&r, blob, n, LIVE_NONE);
    free(blob);
    /* After the event: the first event is what creates the trace's files. */
    if (hex[0])
        mi_save_image(hex, image, size);
}

/* An image handed over in memory: unwrapped first (its size is read from its format). */
static void rec_load_mem(hook_id api, int res, const void *handle, bool is_library, const void *image,
                         const char *fname, options jit, options lib) {
    image = mi_image_data(image);
    rec_load(api, res, handle, is_library, image, mi_image_size(image), fname, jit, lib);
}

#define NO_OPTS ((options){0, NULL, NULL})
#define OPTS(n, o, v) ((options){(o) ? (n) : 0, (const int *)(o), (void *const *)(v)})

#define HOOK(sym, params, call, record) MI_HOOK(CUresult, F_MODULE, sym, params, call, record)

static void rec_load_file(hook_id api, int res, const void *handle, bool is_library,
                          const char *fname, options jit, options lib) {
    size_t size = 0;
    void *data = res ? NULL : read_file(fname, &size);
    rec_load(api, res, handle, is_library, data, size, fname, jit, lib);
    free(data);
}

HOOK(cuModuleLoad, (CUmodule * m, const char *fname), CALL_DRV(cuModuleLoad, m, fname),
     rec_load_file(H_cuModuleLoad, r_, m ? *m : NULL, false, fname, NO_OPTS, NO_OPTS))
HOOK(cuModuleLoadData, (CUmodule * m, const void *image), CALL_DRV(cuModuleLoadData, m, image),
     rec_load_mem(H_cuModuleLoadData, r_, m ? *m : NULL, false, image, NULL, NO_OPTS, NO_OPTS))
HOOK(cuModuleLoadDataEx,
     (CUmodule * m, const void *image, unsigned int n, CUjit_option *o, void **v),
     CALL_DRV(cuModuleLoadDataEx, m, image, n, o, v),
     rec_load_mem(H_cuModuleLoadDataEx, r_, m ? *m : NULL, false, image, NULL, OPTS(n, o, v), NO_OPTS))
HOOK(cuModuleLoadFatBinary, (CUmodule * m, const void *fat), CALL_DRV(cuModuleLoadFatBinary, m, fat),
     rec_load_mem(H_cuModuleLoadFatBinary, r_, m ? *m : NULL, false, fat, NULL, NO_OPTS, NO_OPTS))
HOOK(cuLibraryLoadData,
     (CUlibrary * l, const void *code, CUjit_option *jo, void **jv, unsigned int njo,
      CUlibraryOption *lo, void **lv, unsigned int nlo),
     CALL_DRV(cuLibraryLoadData, l, code, jo, jv, njo, lo, lv, nlo),
     rec_load_mem(H_cuLibraryLoadData, r_, l ? *l : NULL, true, code, NULL, OPTS(njo, jo, jv),
              OPTS(nlo, lo, lv)))
HOOK(cuLibraryLoadFromFile,
     (CUlibrary * l, const char *fname, CUjit_option *jo, void **jv, unsigned int njo,
      CUlibraryOption *lo, void **lv, unsigned int nlo),
     CALL_DRV(cuLibraryLoadFromFile, l, fname, jo, jv, njo, lo, lv, nlo),
     rec_load_file(H_cuLibraryLoadFromFile, r_, l ? *l : NULL, true, fname, OPTS(njo, jo, jv),
                   OPTS(nlo, lo, lv)))

static void rec_global(hook_id api, int res, CUdeviceptr *dptr, size_t *bytes, const void *owner,
                       const char *name) {
    size_t n = name ? strlen(name) : 0;
    medusa_trace_record r = {.type = MEDUSA_EV_GLOBAL, .api = (uint16_t)api, .result = res,
                             .u = {dptr && !res ? *dptr : 0, bytes && !res ? *bytes : 0, U(owner)}};
    mi_emit(&r, name, n, LIVE_NONE);
}

HOOK(cuModuleGetGlobal_v2, (CUdeviceptr * d, size_t *n, CUmodule m, const char *name),
     CALL_DRV(cuModuleGetGlobal_v2, d, n, m, name),
     rec_global(H_cuModuleGetGlobal_v2, r_, d, n, m, name))
HOOK(cuLibraryGetGlobal, (CUdeviceptr * d, size_t *n, CUlibrary l, const char *name),
     CALL_DRV(cuLibraryGetGlobal, d, n, l, name),
     rec_global(H_cuLibraryGetGlobal, r_, d, n, l, name))

static void rec_attr(hook_id api, int res, CUfunction f, int attr, int value) {
    if (!f)
        return;
    mi_func(f);
    medusa_trace_record r = {.type = MEDUSA_EV_FUNC_ATTR, .api = (uint16_t)api, .result = res,
                             .u = {U(f), (uint64_t)attr, (uint64_t)(int64_t)value}};
    mi_emit(&r, NULL, 0, LIVE_NONE);
}

HOOK(cuFuncSetAttribute, (CUfunction f, CUfunction_attribute a, int v),
     CALL_DRV(cuFuncSetAttribute, f, a, v), rec_attr(H_cuFuncSetAttribute, r_, f, (int)a, v))

/* NOTE: cudaFuncAttribute values equal the CUfunction_attribute ones they set
 * (MaxDynamicSharedMemorySize = 8, PreferredSharedMemoryCarveout = 9, ...). */
MI_EXPORT cudaError_t cudaFuncSetAttribute(const void *stub, enum cudaFuncAttribute a, int v) {
    mi_gate g = mi_enter(F_MODULE);
    cudaError_t r = CALL_RT(cudaFuncSetAttribute, stub, a, v);
    if (g.rec)
        rec_attr(H_cudaFuncSetAttribute, r, mi_func_of_stub(H_cudaFuncSetAttribute, stub), (int)a, v);
    mi_leave(g);
    return r;
}
