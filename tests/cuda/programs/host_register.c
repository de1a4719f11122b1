/* cudaHostRegister on a read-only file mapping and on malloc'd memory: flags, errors, attributes,
 * kernels reading it, and what a write into a read-only registration does.
 * argv[1]: "api" (default), "write-file", "write-anon", "after-unregister", "memcpy-into",
 * "read-cut-short" (the file truncated under the registration, then read by a kernel),
 * "shared-file DIR" (a writable shared mapping of a file in DIR, registered writable). */
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "simcuda/simcuda.h"

extern void vector_add(void);
extern void scale_inplace(void);

enum { N = 2048, BYTES = N * 4 }; /* two pages */

static int g_file = -1; /* the mapped file, kept open to be cut short */

static float *map_file(void) {
    char path[] = "/tmp/simcuda-hostreg-XXXXXX";
    int fd = mkstemp(path);
    float v[N];
    for (int i = 0; i < N; i++)
        v[i] = (float)i;
    if (fd < 0 || write(fd, v, sizeof v) != (ssize_t)sizeof v)
        exit(2);
    unlink(path);
    void *p = mmap(NULL, BYTES, PROT_READ, MAP_SHARED, fd, 0);
    g_file = fd;
    return p == MAP_FAILED ? (exit(2), NULL) : p;
}

static int launch_add(float *out, float *a, float *b) {
    int n = N;
    void *args[] = {&out, &a, &b, &n};
    int e = cudaLaunchKernel((const void *)vector_add, (dim3){8, 1, 1}, (dim3){256, 1, 1}, args, 0, 0);
    return e ? e : cudaDeviceSynchronize(); /* a fault shows once the kernel has run */
}

static int launch_scale(float *x) {
    float f = 2.0f;
    int n = N;
    void *args[] = {&x, &f, &n};
    int e = cudaLaunchKernel((const void *)scale_inplace, (dim3){8, 1, 1}, (dim3){256, 1, 1}, args, 0, 0);
    return e ? e : cudaDeviceSynchronize();
}

static void errors(float *ro) {
    SHOW("read-only mapping without the flag", cudaHostRegister(ro, BYTES, cudaHostRegisterMapped));
    SHOW("size 0", cudaHostRegister(ro, 0, cudaHostRegisterReadOnly));
    SHOW("null", cudaHostRegister(NULL, BYTES, cudaHostRegisterReadOnly));
    SHOW("unknown flag", cudaHostRegister(ro, BYTES, 0x10 | cudaHostRegisterReadOnly));
    SHOW("io memory", cudaHostRegister(ro, BYTES, cudaHostRegisterIoMemory | cudaHostRegisterReadOnly));
    void *dev = NULL;
    CHECK(cudaMalloc(&dev, 4096));
    SHOW("device memory", cudaHostRegister(dev, 4096, 0));
    CHECK(cudaFree(dev));
    void *hole = mmap(NULL, 3 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap((char *)hole + 4096, 4096);
    SHOW("unmapped", cudaHostRegister(hole, 3 * 4096, cudaHostRegisterReadOnly));
    munmap(hole, 3 * 4096);
}

static void overlaps(void) {
    char *buf = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(cudaHostRegister(buf + 4096, 4096, cudaHostRegisterDefault));
    SHOW("same range again", cudaHostRegister(buf + 4096, 4096, 0));
    SHOW("range around it", cudaHostRegister(buf, 4 * 4096, 0));
    SHOW("range into it", cudaHostRegister(buf + 2048, 4096, 0));
    SHOW("next to it", cudaHostRegister(buf + 2 * 4096, 4096, 0));
    void *d = NULL;
    SHOW("default flags are mapped", cudaHostGetDevicePointer(&d, buf + 4096 + 100, 0));
    SHOW("interior unregister", cudaHostUnregister(buf + 4096 + 100));
    CHECK(cudaHostUnregister(buf + 4096));
    CHECK(cudaHostUnregister(buf + 2 * 4096));
    void *pinned = NULL;
    CHECK(cudaHostAlloc(&pinned, 4096, cudaHostAllocMapped));
    SHOW("register pinned", cudaHostRegister(pinned, 4096, 0));
    SHOW("unregister pinned", cudaHostUnregister(pinned));
    printf("pinned: %llu\nregistered: %llu\n", (unsigned long long)(uintptr_t)pinned,
           (unsigned long long)(uintptr_t)(buf + 4096));
    CHECK(cudaFreeHost(pinned));
    munmap(buf, 4 * 4096);
}

/* The driver entry points directly, and frees of the wrong kind, which must end nothing. */
static void driver_level(void) {
    char *buf = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(cuMemHostRegister(buf, 4096, CU_MEMHOSTREGISTER_DEVICEMAP));
    CUdeviceptr d = 0;
    CHECK(cuMemHostGetDevicePointer(&d, buf, 0));
    printf("driver pointer: %d\n", d == (CUdeviceptr)(uintptr_t)buf);
    SHOW("free host on registered", cuMemFreeHost(buf));
    CHECK(cuMemHostUnregister(buf));
    printf("driver registered: %llu\n", (unsigned long long)(uintptr_t)buf);
    munmap(buf, 4096);
}

static void attributes(float *ro, float *ro_dev) {
    struct cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, ro_dev + 10));
    printf("type: %d\n", (int)a.type);
    printf("pointers: %d\n", a.devicePointer == (void *)(ro_dev + 10) && a.hostPointer == (void *)(ro + 10));
    CUdeviceptr start = 0;
    size_t size = 0;
    unsigned access = 0;
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)(ro_dev + 10)));
    CHECK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)ro_dev));
    CHECK(cuPointerGetAttribute(&access, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, (CUdeviceptr)ro_dev));
    printf("range: %d %zu\n", start == (CUdeviceptr)ro_dev, size);
    printf("access read-only: %d\n", access == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ);
    int v = 0;
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrHostRegisterReadOnlySupported, 0));
    printf("read-only supported: %d\n", v);
}

static void capture(float *rw) {
    cudaStream_t s;
    cudaGraph_t g;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    SHOW("register while capturing", cudaHostRegister(rw, 4096, 0));
    SHOW("capture after", cudaStreamEndCapture(s, &g));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    SHOW("register in relaxed capture", cudaHostRegister(rw, 4096, 0));
    SHOW("unregister in relaxed capture", cudaHostUnregister(rw));
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphDestroy(g));
}

/* A writable shared mapping of a file in `dir`, registered for device writes, then read-only. */
static int shared_file(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/simcuda-shared-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, BYTES) != 0)
        exit(2);
    unlink(path);
    void *p = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        exit(2);
    int e = cudaHostRegister(p, BYTES, cudaHostRegisterMapped);
    SHOW("writable shared file", e);
    if (!e)
        CHECK(cudaHostUnregister(p));
    SHOW("read-only shared file", cudaHostRegister(p, BYTES, cudaHostRegisterReadOnly));
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "api";
    CHECK(cudaSetDevice(0));
    if (!strcmp(mode, "shared-file") && argc > 2)
        return shared_file(argv[2]);
    float *ro = map_file(), *ro_dev = NULL, *a = NULL, *out = NULL;
    CHECK(cudaMalloc((void **)&a, BYTES));
    CHECK(cudaMalloc((void **)&out, BYTES));
    CHECK(cudaMemset(a, 0, BYTES));
    if (!strcmp(mode, "api"))
        errors(ro);
    CHECK(cudaHostRegister(ro, BYTES, cudaHostRegisterMapped | cudaHostRegisterReadOnly));
    CHECK(cudaHostGetDevicePointer((void **)&ro_dev, ro, 0));
    if (!strcmp(mode, "api")) {
        printf("same pointer: %d\n", ro_dev == ro);
        printf("file: %llu\n", (unsigned long long)(uintptr_t)ro);
        overlaps();
        driver_level();
        attributes(ro, ro_dev);
        float *rw = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        capture(rw);
        simcudaResetTraffic();
        CHECK(launch_add(out, a, ro_dev));
        uint64_t t[3];
        simcudaGetTraffic(t);
        printf("host-mapped bytes read: %llu\n", (unsigned long long)t[1]);
        float back[N];
        CHECK(cudaMemcpy(back, out, BYTES, cudaMemcpyDeviceToHost));
        printf("sum ok: %d\n", back[0] == 0.0f && back[N - 1] == (float)(N - 1));
        SHOW("memset into read-only", cudaMemset(ro_dev, 0, 16));
        SHOW("unregister", cudaHostUnregister(ro));
        SHOW("unregister again", cudaHostUnregister(ro));
        void *d = NULL;
        SHOW("device pointer after", cudaHostGetDevicePointer(&d, ro, 0));
        struct cudaPointerAttributes at;
        CHECK(cudaPointerGetAttributes(&at, ro));
        printf("type after: %d\n", (int)at.type);
    } else if (!strcmp(mode, "memcpy-into")) {
        SHOW("memcpy into read-only", cudaMemcpy(ro_dev, a, BYTES, cudaMemcpyDeviceToDevice));
        SHOW("context after", cudaDeviceSynchronize());
    } else if (!strcmp(mode, "write-file")) {
        SHOW("write kernel", launch_scale(ro_dev));
    } else if (!strcmp(mode, "write-anon")) {
        float *rw = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(cudaHostRegister(rw, 3 * 4096, cudaHostRegisterMapped | cudaHostRegisterReadOnly));
        rw[5] = 1.0f; /* the host still writes its own memory */
        SHOW("write kernel", launch_scale(rw));
        rw[6] = 1.0f;
        printf("host writes: %d\n", rw[5] == 1.0f && rw[6] == 1.0f);
    } else if (!strcmp(mode, "read-cut-short")) {
        if (ftruncate(g_file, 0))
            return 2;
        SHOW("read kernel", launch_add(out, a, ro_dev));
    } else if (!strcmp(mode, "after-unregister")) {
        CHECK(cudaHostUnregister(ro));
        SHOW("read after unregister", launch_add(out, a, ro_dev));
    }
    return 0;
}
