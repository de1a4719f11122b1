/* libmedusa_restore.so: builds CUDA graphs from a restore plan, in C (no interpreter per node).
 * The Python restorer lays the plan out in these arrays (numpy dtypes mirror them exactly). */
#ifndef MEDUSA_RESTORE_H
#define MEDUSA_RESTORE_H

#include <cuda.h>
#include <stdint.h>

typedef struct {
    uint32_t type; /* CUgraphNodeType: kernel, memcpy, memset or empty */
    uint32_t func; /* kernel: index into funcs */
    uint32_t grid[3], block[3], shared;
    uint32_t param_off, param_len; /* kernel: the recorded parameter bytes, in params */
    uint32_t reloc_off, reloc_len; /* the node's relocations, in relocs */
    uint32_t depth;         /* memcpy: slices (0 or 1 for a 1-D or 2-D copy) */
    uint64_t width, height; /* memcpy: bytes per row, rows; memset: elements per row, rows (only
                               1-D copies and fills are rebuilt: no pitch is recorded) */
    uint64_t value;         /* memset: the value */
    uint64_t elem;          /* memset: element size; memcpy: src memory type | dst type << 8 */
} mr_node;

/* Word `offset` (bytes; memcpy/memset: 0 = destination, 8 = source) becomes
 * bases[kind][target] + addend. */
typedef struct {
    uint32_t offset, kind;
    uint64_t target;
    int64_t addend;
} mr_reloc;

typedef struct {
    uint32_t from, to;
    uint8_t from_port, to_port, type, pad[5];
} mr_edge;

/* A kernel node attribute (CUlaunchAttributeValue); pointer words in it (an access-policy
 * window's base_ptr) are relocated like parameter words, offsets within value. */
typedef struct {
    uint32_t node, attr;
    uint8_t value[64];
    uint32_t reloc_off, reloc_len; /* in relocs */
} mr_attr;

/* A kernel: its handle and where its parameters lie in the parameter bytes (from
 * cuFuncGetParamInfo at record time), so that it is launched with kernelParams. */
typedef struct {
    uint64_t func; /* CUfunction */
    uint32_t layout_off, layout_len; /* in the layout table */
} mr_func;

typedef struct {
    uint32_t offset, size;
} mr_param;

typedef struct {
    const mr_func *funcs;
    uint32_t num_funcs;
    uint32_t num_params;
    const mr_param *params;
} mr_kernels;

/* Every index in a graph is checked against the length of the table it indexes: a plan comes
 * from a file, and a bad one must fail with an error, never read or write out of bounds. */
typedef struct {
    const mr_node *nodes;
    uint32_t num_nodes;
    const uint8_t *params;
    uint64_t params_len;
    const mr_reloc *relocs;
    uint32_t num_relocs;
    const mr_edge *edges;
    uint32_t num_edges;
    const mr_attr *attrs;
    uint32_t num_attrs;
} mr_graph;

#define MR_KINDS 4
#define MR_ABI_VERSION 8 /* 3: kernelParams from parameter layouts; attribute relocations; depth;
                          4: mr_load_chunks; 5: mr_load.progress, mr_progress_*;
                          6: mr_build_graph keeps no graph (destroyed once instantiated);
                          7: mr_load.fd, file_offset (a store read, not mapped);
                          8: mr_build_plan, mr_find_stubs, mr_image_function */
int mr_abi_version(void);
#define MR_MAX_PARAM_BYTES 32764u /* CUDA's limit on a kernel's parameter buffer */
/* Builds, instantiates and uploads one graph into *exec_out (the caller destroys it); the graph
 * itself is destroyed. Returns a CUresult; on failure err says which node, and nothing is left. */
int mr_build_graph(const mr_graph *g, const mr_kernels *k,
                   const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS],
                   CUstream stream, CUgraphExec *exec_out, char *err, size_t errlen);
/* A plan's graphs as the artifact stores them (medusa.artifact.layout), each array where the
 * caller holds it (lengths in bytes, whole records each): per template its rows, parameter bytes,
 * relocations and edges; per graph its template, the rows that replace its template's (idx says
 * which), its own parameter bytes and relocations, which follow its template's (a row's offsets
 * count from the template's start), and its node attributes. */
enum { MR_T_NODES, MR_T_PARAMS, MR_T_RELOCS, MR_T_EDGES, MR_T_ARRAYS };
enum { MR_G_IDX, MR_G_ROWS, MR_G_PARAMS, MR_G_RELOCS, MR_G_ATTRS, MR_G_ARRAYS };
typedef struct {
    uint32_t num_templates, num_graphs;
    const uint8_t *const *templates; /* MR_T_ARRAYS per template */
    const uint64_t *template_lens;
    const uint32_t *graph_template; /* per graph */
    const uint8_t *const *graphs;   /* MR_G_ARRAYS per graph */
    const uint64_t *graph_lens;
} mr_plan;

/* Each graph of a plan, in order, into execs[i] (secs[i]: the seconds it took), as mr_build_graph
 * would build it; a graph of a template already built is had from that graph by setting the
 * kernel nodes that differ. *built: how many were built. On failure the CUresult of the first
 * graph that failed (graph *built; err says why), and the execs before it stay (the caller
 * destroys them). */
int mr_build_plan(const mr_plan *p, const mr_kernels *k, const uint64_t *const bases[MR_KINDS],
                  const uint64_t num_bases[MR_KINDS], CUstream stream, CUgraphExec *execs,
                  double *secs, uint32_t *built, char *err, size_t errlen);
/* ---- finding kernels ---- */
/* For each of n functions: funcs[i] its CUfunction when symbols[i] (NULL: none) names an exported
 * host stub in the global scope, get_func_by_symbol (the runtime's cudaGetFuncBySymbol) gives a
 * function for it, and its name (cuFuncGetName) is names[i]; else 0. Returns 0, or -1 when the
 * driver has no cuFuncGetName. */
int mr_find_stubs(uint32_t n, const char *const *symbols, const char *const *names,
                  void *get_func_by_symbol, uint64_t *funcs);
/* The function NAME of a loaded library (cuLibraryGetKernel, cuKernelGetFunction) or module
 * (cuModuleGetFunction): a CUresult, or -1 when the driver has no such function. */
int mr_image_function(void *handle, int is_library, const char *name, CUfunction *out);
/* Patches pointer words into a buffer (a permanent buffer's saved contents). Returns 0, or -1 - i
 * for the first relocation i that lies outside the buffer or has no target. */
int mr_relocate(uint8_t *data, size_t len, const mr_reloc *relocs, uint32_t n,
                const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS]);

/* ---- weight-store chunks to the device (chunk_loader.c) ---- */
/* How far a load has got, for an engine that runs layers while later ones still arrive: the
 * watermark is the lowest chunk not yet done, a chunk being done when it passed its checksum and
 * all of its copies are queued on the load's stream (workers finish out of order). */
typedef struct mr_progress mr_progress;
/* hold: chunks from this index on are not taken until mr_progress_release (tests hold a load
 * part way); UINT32_MAX holds nothing. NULL when out of memory. */
mr_progress *mr_progress_new(uint64_t chunk_size, uint32_t num_chunks, uint32_t hold);
void mr_progress_free(mr_progress *p);
/* Blocks until every chunk holding a byte of [0, offset) of the store's data is done (returns 0),
 * or the load ended without them: 1 a chunk did not match its digest (*bad: the lowest such), 2
 * it stopped otherwise (a CUDA error, bad arguments, or mr_progress_stop). */
int mr_progress_wait(mr_progress *p, uint64_t offset, uint32_t *bad);
/* The watermark now, in chunks (done below it). */
uint32_t mr_progress_done(mr_progress *p);
void mr_progress_release(mr_progress *p, uint32_t hold);
/* Ends a load that never ran (its waiters get 2); no effect on one that ended. */
void mr_progress_stop(mr_progress *p);

typedef struct {
    uint64_t dst;    /* device address */
    uint64_t src;    /* offset in the chunk */
    uint64_t nbytes;
} mr_piece;

typedef struct {
    /* The store's data: in memory nobody else can change (a sealed copy, mapped), or NULL: read
     * from fd at file_offset (a file another user may write or cut short is read, never mapped:
     * a mapping cut short would kill the process with SIGBUS; a short read is an error). */
    const uint8_t *data;
    uint64_t data_size, chunk_size;
    uint32_t num_chunks;
    const uint8_t *digests;  /* XXH3-128 per chunk (16 bytes each); NULL: nothing is checked */
    const uint64_t *piece_start; /* num_chunks + 1: chunk i's pieces are [start[i], start[i+1]) */
    const mr_piece *pieces;
    void *const *slots;      /* pinned staging slots of slot_bytes (>= chunk_size) each */
    void *const *events;     /* one cudaEvent_t per slot */
    uint32_t num_slots;
    uint64_t slot_bytes;
    void *stream;            /* cudaStream_t the copies are queued on */
    uint32_t workers;        /* threads, this one included */
    mr_progress *progress;   /* NULL, or made for this load's chunk size and count */
    int32_t fd;              /* data NULL: the file the data is read from */
    uint64_t file_offset;    /* where the data starts in it */
} mr_load;

/* Copies every chunk's pieces to the device through the slots and checks each chunk (staged, or
 * in place when it has no pieces) against its digest, several chunks in flight. Runs without the
 * caller's interpreter (the GIL is released), so start-up goes on meanwhile. Returns 0; 1 when a
 * chunk does not match its digest (*bad: the lowest such chunk); 2 on a CUDA error (err says
 * which call and code); 3 when the arguments do not fit together (err says how); 4 when the file
 * could not be read (cut short while loading, or an I/O error: *bad is the chunk, err says why).
 * The copies may still be in flight on return: synchronize the stream. */
int mr_load_chunks(const mr_load *L, uint32_t *bad, char *err, size_t errlen);

#endif
