/* Which host code a module image may bring in. An image names the shared object holding its CPU
 * kernels, and dlopen runs that object's constructors before any check of ours could: so an image
 * only ever reaches an object already loaded in this process, or a kernel library installed next
 * to libsimcuda.so itself. Any other path is refused without being opened. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

/* The directory libsimcuda.so lives in (symbolic links resolved), into dir. */
static bool kernel_dir(char dir[PATH_MAX]) {
    Dl_info info;
    if (!dladdr((void *)&sim_open_code, &info) || !info.dli_fname || !realpath(info.dli_fname, dir))
        return false;
    char *slash = strrchr(dir, '/');
    if (!slash)
        return false;
    *slash = '\0';
    return true;
}

/* path, symbolic links resolved into real, if that is a regular file directly inside dir. */
static bool installed(const char *dir, const char *path, char real[PATH_MAX]) {
    struct stat st;
    size_t n = strlen(dir);
    if (!realpath(path, real) || stat(real, &st) || !S_ISREG(st.st_mode))
        return false;
    return strncmp(real, dir, n) == 0 && real[n] == '/' && !strchr(real + n + 1, '/');
}

CUresult sim_open_code(const char *path, void **dl) {
    *dl = NULL;
    if (!path || !*path)
        return sim_fail(CUDA_ERROR_INVALID_IMAGE, "the image names no code object");
    /* NOTE: RTLD_NOLOAD maps nothing and runs nothing: it only finds an object already loaded. It
     * still opens the file, so only a regular file is tried (a FIFO would block the open). */
    struct stat st;
    if (strchr(path, '/') && !stat(path, &st) && S_ISREG(st.st_mode) &&
        (*dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)))
        return CUDA_SUCCESS;
    char dir[PATH_MAX], real[PATH_MAX];
    if (!kernel_dir(dir))
        return sim_fail(CUDA_ERROR_INVALID_IMAGE, "the kernel-library directory of libsimcuda.so "
                        "cannot be found, so image code object %s is refused", path);
    if (!installed(dir, path, real))
        return sim_fail(CUDA_ERROR_INVALID_IMAGE,
                        "image code object %s refused: it is not loaded in this process, nor a "
                        "kernel library installed with simcuda in %s (an image may name no other "
                        "code)", path, dir);
    if (!(*dl = dlopen(real, RTLD_NOW | RTLD_LOCAL)))
        return sim_fail(CUDA_ERROR_INVALID_IMAGE, "image code object %s cannot be loaded: %s", real,
                        dlerror());
    return CUDA_SUCCESS;
}
