/* Module images: what cuLibraryLoadData takes. A simcuda image names the shared object holding the
 * CPU code and lists the kernels (name + parameter signature) and globals; loading one opens that
 * object (only if codeobj.c allows it) and checks it still exports a matching module table, so a
 * stale image is refused. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
    const unsigned char *p, *end;
    bool bad;
} reader;

static uint32_t rd_u32(reader *r) {
    uint32_t v = 0;
    if (r->end - r->p < 4) {
        r->bad = true;
        return 0;
    }
    memcpy(&v, r->p, 4);
    r->p += 4;
    return v;
}

static uint64_t rd_u64(reader *r) {
    uint64_t lo = rd_u32(r), hi = rd_u32(r);
    return lo | (hi << 32);
}

static char *rd_str(reader *r) {
    uint32_t n = rd_u32(r);
    if (r->bad || n > 4096 || (size_t)(r->end - r->p) < n) {
        r->bad = true;
        return NULL;
    }
    char *s = strndup((const char *)r->p, n);
    r->p += n;
    return s;
}

/* ---- signatures ---- */
static int add_param(sim_func *f, uint32_t size, uint32_t align) {
    if (f->num_params == SIM_MAX_PARAMS)
        return -1;
    uint32_t off = (f->param_bytes + align - 1) & ~(align - 1);
    f->params[f->num_params++] = (sim_param){off, size};
    f->param_bytes = off + size;
    return f->param_bytes > SIM_MAX_PARAM_BYTES ? -1 : 0;
}

static void add_ptr_word(sim_func *f, uint32_t off) {
    f->ptr_words = realloc(f->ptr_words, (f->num_ptr_words + 1) * sizeof *f->ptr_words);
    f->ptr_words[f->num_ptr_words++] = off;
}

int sim_parse_signature(sim_func *f, const char *sig) {
    for (const char *s = sig; *s;) {
        if (*s == ' ') {
            s++;
            continue;
        }
        char c = *s++;
        int bad = 0;
        switch (c) {
        case 'p':
            bad = add_param(f, 8, 8);
            add_ptr_word(f, f->params[f->num_params - 1].offset);
            break;
        case 'b': bad = add_param(f, 1, 1); break;
        case 'h': bad = add_param(f, 2, 2); break;
        case 'i': case 'u': case 'f': bad = add_param(f, 4, 4); break;
        case 'l': case 'q': case 'd': bad = add_param(f, 8, 8); break;
        case 's': {
            char *end;
            unsigned long n = strtoul(s, &end, 10);
            if (end == s || n == 0)
                return -1;
            s = end;
            bad = add_param(f, (uint32_t)n, 8);
            uint32_t base = f->params[f->num_params - 1].offset;
            if (*s == '@') {
                do {
                    unsigned long o = strtoul(++s, &end, 10);
                    if (end == s || o % 8 || o + 8 > n)
                        return -1;
                    add_ptr_word(f, base + (uint32_t)o);
                    s = end;
                } while (*s == ',');
            }
            break;
        }
        default: return -1;
        }
        if (bad || (*s && *s != ' '))
            return -1;
    }
    return 0;
}

/* ---- building an image (runtime side) ---- */
typedef struct {
    unsigned char *v;
    size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->v = realloc(b->v, b->cap);
    }
    memcpy(b->v + b->n, p, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) {
    put_u32(b, (uint32_t)strlen(s));
    put(b, s, strlen(s));
}

unsigned char *sim_image_build(const simcuda_module_desc *d, size_t *size) {
    Dl_info info;
    if (!dladdr(d, &info) || !info.dli_fname)
        return NULL;
    buf b = {0};
    put(&b, SIMCUDA_IMAGE_MAGIC, 8);
    put_u32(&b, SIMCUDA_IMAGE_VERSION);
    put_u32(&b, 0);
    put_u64(&b, 0); /* total size, patched below */
    put_str(&b, d->name);
    put_str(&b, info.dli_fname);
    put_u32(&b, d->num_kernels);
    for (unsigned i = 0; i < d->num_kernels; i++) {
        put_str(&b, d->kernels[i].name);
        put_str(&b, d->kernels[i].signature);
    }
    put_u32(&b, d->num_globals);
    for (unsigned i = 0; i < d->num_globals; i++) {
        put_str(&b, d->globals[i].name);
        put_u64(&b, d->globals[i].size);
    }
    uint64_t total = b.n;
    memcpy(b.v + 16, &total, 8);
    *size = b.n;
    return b.v;
}

/* ---- loading an image (driver side) ---- */
static CUresult bind_code(sim_library *lib, const char *path, const simcuda_module_desc **out) {
    CUresult e = sim_open_code(path, &lib->dl);
    if (e)
        return e;
    char sym[160];
    snprintf(sym, sizeof sym, "__simcuda_module_%s", lib->module_name);
    const simcuda_module_desc *d = dlsym(lib->dl, sym);
    if (!d || d->num_kernels != lib->num_funcs || d->num_globals != lib->num_globals)
        return sim_fail(CUDA_ERROR_INVALID_IMAGE, "%s no longer matches the image of module %s",
                        path, lib->module_name);
    *out = d;
    return CUDA_SUCCESS;
}

static CUresult read_image(reader *r, sim_library *lib, char **path, char ***sigs) {
    char *name = rd_str(r);
    *path = rd_str(r);
    lib->num_funcs = rd_u32(r);
    if (r->bad || !name || lib->num_funcs > 100000) {
        free(name);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    snprintf(lib->module_name, sizeof lib->module_name, "%s", name);
    free(name);
    lib->funcs = calloc(lib->num_funcs ? lib->num_funcs : 1, sizeof *lib->funcs);
    *sigs = calloc(lib->num_funcs ? lib->num_funcs : 1, sizeof **sigs);
    for (unsigned i = 0; i < lib->num_funcs && !r->bad; i++) {
        lib->funcs[i].name = rd_str(r);
        (*sigs)[i] = rd_str(r);
    }
    lib->num_globals = rd_u32(r);
    if (r->bad || lib->num_globals > 100000)
        return CUDA_ERROR_INVALID_IMAGE;
    lib->global_names = calloc(lib->num_globals + 1, sizeof *lib->global_names);
    lib->global_sizes = calloc(lib->num_globals + 1, sizeof *lib->global_sizes);
    lib->globals = calloc(lib->num_globals + 1, sizeof *lib->globals);
    for (unsigned i = 0; i < lib->num_globals && !r->bad; i++) {
        lib->global_names[i] = rd_str(r);
        lib->global_sizes[i] = rd_u64(r);
    }
    return r->bad ? CUDA_ERROR_INVALID_IMAGE : CUDA_SUCCESS;
}

static CUresult bind_kernels(sim_library *lib, const simcuda_module_desc *d, char **sigs) {
    for (unsigned i = 0; i < lib->num_funcs; i++) {
        sim_func *f = &lib->funcs[i];
        if (strcmp(d->kernels[i].name, f->name) || strcmp(d->kernels[i].signature, sigs[i]))
            return sim_fail(CUDA_ERROR_INVALID_IMAGE, "kernel %u of module %s changed since the image "
                            "was made", i, lib->module_name);
        if (sim_parse_signature(f, sigs[i]))
            return sim_fail(CUDA_ERROR_INVALID_IMAGE, "kernel %s has a malformed signature '%s'",
                            f->name, sigs[i]);
        f->lib = lib;
        f->fn = d->kernels[i].fn;
        f->loaded = g_sim.cfg.eager_loading;
        f->max_dynamic_smem = 48 * 1024;
    }
    for (unsigned i = 0; i < lib->num_globals; i++) {
        if (strcmp(d->globals[i].name, lib->global_names[i]) || d->globals[i].size != lib->global_sizes[i])
            return sim_fail(CUDA_ERROR_INVALID_IMAGE, "global %u of module %s changed", i,
                            lib->module_name);
        uintptr_t p;
        CUresult e = sim_dev_alloc(lib->global_sizes[i] ? lib->global_sizes[i] : 1, A_GLOBAL, &p);
        if (e)
            return e;
        lib->globals[i] = (void *)p;
        if (d->globals[i].init)
            memcpy((void *)p, d->globals[i].init, lib->global_sizes[i]);
        else
            memset((void *)p, 0, lib->global_sizes[i]);
    }
    return CUDA_SUCCESS;
}

/* What the runtime registers is a wrapper (__fatBinC_Wrapper_t): {magic, version, the image, ...};
 * the driver takes either form. NOTE: the wrapper holds a pointer, so its bytes differ per run. */
static const void *unwrap(const void *image) {
    const simcuda_fatbin_wrapper *w = image;
    return image && w->magic == SIMCUDA_FATBIN_WRAPPER_MAGIC && w->version == 1 ? w->data : image;
}

/* Called with the lock held. */
CUresult sim_library_from_image(const void *image, sim_library **out) {
    image = unwrap(image);
    if (!image || memcmp(image, SIMCUDA_IMAGE_MAGIC, 8) != 0)
        return sim_fail(CUDA_ERROR_INVALID_IMAGE, "not a simcuda module image (bad magic)");
    reader r = {(const unsigned char *)image + 8, (const unsigned char *)image + 24, false};
    uint32_t version = rd_u32(&r);
    rd_u32(&r);
    uint64_t total = rd_u64(&r);
    if (version != SIMCUDA_IMAGE_VERSION || total < 24 || total > (1u << 30))
        return sim_fail(CUDA_ERROR_INVALID_IMAGE, "unsupported simcuda image version %u", version);
    sim_library *lib = calloc(1, sizeof *lib);
    lib->image = malloc(total);
    memcpy(lib->image, image, total);
    lib->image_size = total;
    r = (reader){lib->image + 24, lib->image + total, false};
    char *path = NULL, **sigs = NULL;
    const simcuda_module_desc *d = NULL;
    CUresult e = read_image(&r, lib, &path, &sigs);
    if (e)
        sim_fail(e, "truncated or corrupt simcuda module image");
    else
        e = bind_code(lib, path, &d);
    if (!e)
        e = bind_kernels(lib, d, sigs);
    for (unsigned i = 0; sigs && i < lib->num_funcs; i++)
        free(sigs[i]);
    free(sigs);
    free(path);
    if (e) {
        sim_library_free(lib);
        return e;
    }
    sim_handle_add(lib, H_LIBRARY);
    for (unsigned i = 0; i < lib->num_funcs; i++)
    {
        sim_handle_add(&lib->funcs[i], H_KERNEL);
        sim_handle_add(SIM_FUNC_HANDLE(&lib->funcs[i]), H_FUNC);
    }
    *out = lib;
    return CUDA_SUCCESS;
}

void sim_library_free(sim_library *lib) {
    for (unsigned i = 0; i < lib->num_funcs; i++) {
        sim_handle_del(&lib->funcs[i]);
        sim_handle_del(SIM_FUNC_HANDLE(&lib->funcs[i]));
        free((char *)lib->funcs[i].name);
        free(lib->funcs[i].ptr_words);
    }
    for (unsigned i = 0; i < lib->num_globals; i++) {
        if (lib->globals && lib->globals[i])
            sim_dev_free((uintptr_t)lib->globals[i], A_GLOBAL);
        free(lib->global_names[i]);
    }
    sim_handle_del(lib);
    if (lib->dl)
        dlclose(lib->dl);
    free(lib->funcs);
    free(lib->global_names);
    free(lib->global_sizes);
    free(lib->globals);
    free(lib->image);
    free(lib);
}
