/* The CUDA driver's graph API as restore uses it, looked up through cuGetProcAddress like any
 * CUDA library's (internal to libmedusa_restore). */
#ifndef MEDUSA_GRAPH_DRIVER_H
#define MEDUSA_GRAPH_DRIVER_H

#include <stddef.h>

#include <cudaTypedefs.h>

typedef struct {
    PFN_cuGraphCreate_v10000 create;
    PFN_cuGraphDestroy_v10000 destroy;
    PFN_cuGraphAddKernelNode_v12000 kernel;
    PFN_cuGraphAddMemcpyNode_v10000 memcpy_;
    PFN_cuGraphAddMemsetNode_v10000 memset_;
    PFN_cuGraphAddEmptyNode_v10000 empty;
    PFN_cuGraphAddDependencies_v12030 deps;
    PFN_cuGraphKernelNodeSetAttribute_v11000 attr;
    PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
    PFN_cuGraphUpload_v11010 upload;
    PFN_cuGraphExecDestroy_v10000 exec_destroy;
    PFN_cuCtxGetCurrent_v4000 ctx;
    PFN_cuGraphKernelNodeSetParams_v12000 kernel_set; /* optional: no graph is built anew then */
    PFN_cuGetErrorName_v6000 name;                    /* optional: only for messages */
    /* optional: for finding kernels (mr_find_stubs, mr_image_function) */
    PFN_cuFuncGetName_v12030 func_name;
    PFN_cuLibraryGetKernel_v12000 library_kernel;
    PFN_cuKernelGetFunction_v12000 kernel_function;
    PFN_cuModuleGetFunction_v2000 module_function;
    int ok;                                           /* every function that is not optional */
} mr_driver;

/* The driver's functions, looked up on the first call. */
const mr_driver *mr_driver_api(void);

/* "WHERE: CALL failed: CUDA_ERROR_NAME (code)", so that a GPU run's log says what failed. */
void mr_failed(char *err, size_t errlen, const char *where, const char *call, CUresult e);

#endif
