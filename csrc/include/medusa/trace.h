/* The Medusa trace format, version 1 (minor 1: ACCESS records). Written by libmedusa_interpose.so, read by medusa/trace/.
 *
 * A trace is three things side by side (PATH is the value of MEDUSA_TRACE):
 *   PATH         a 64-byte file header, then fixed-size 96-byte records (medusa_trace_record);
 *   PATH.blobs   the side table: an 8-byte magic, then blobs, each a u32 length + bytes, padded to
 *                8 bytes; a record's `blob` is the offset of its length word (0 = none);
 *   PATH.images/ each loaded module or library image saved once, named <sha256 hex>.img.
 * Everything is little-endian. A clean exit ends PATH with one MEDUSA_EV_END record; a trace
 * without it was cut short (crash, kill, os._exit) but its complete records are still valid.
 *
 * Every record carries a global sequence number, so that a launch can be matched against the
 * allocation history (which allocations were live when it happened). */
#ifndef MEDUSA_TRACE_H
#define MEDUSA_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define MEDUSA_TRACE_MAGIC "MEDUSATR"
#define MEDUSA_TRACE_BLOB_MAGIC "MEDUSABL"
#define MEDUSA_TRACE_VERSION 1u
#define MEDUSA_TRACE_MINOR 1u /* in the header's `minor`: 0 had no ACCESS records; readers of
                                 minor 0 refuse a record type they do not know */
#define MEDUSA_TRACE_HEADER_SIZE 64u
#define MEDUSA_TRACE_RECORD_SIZE 96u

typedef struct {
    char magic[8];          /* MEDUSA_TRACE_MAGIC */
    uint32_t version;       /* MEDUSA_TRACE_VERSION */
    uint32_t header_size;   /* MEDUSA_TRACE_HEADER_SIZE */
    uint32_t record_size;   /* MEDUSA_TRACE_RECORD_SIZE */
    uint32_t pid;
    uint64_t start_unix_ns; /* wall clock when recording started */
    uint32_t mode;          /* medusa_trace_mode */
    uint32_t minor;         /* MEDUSA_TRACE_MINOR: record types added without breaking old traces */
    uint8_t reserved[24];
} medusa_trace_header;

typedef enum { MEDUSA_MODE_RECORD = 1, MEDUSA_MODE_RESTORE = 2 } medusa_trace_mode;

/* Record types. The payload field names are the ones the Python reader exposes. */
typedef enum {
    MEDUSA_EV_PROCESS = 1,      /* u: pid, ppid;                     blob: argv (NUL separated) */
    MEDUSA_EV_DEVICE = 2,       /* u: device, total_mem, cc_major, cc_minor, driver_version,
                                   runtime_version, sm_count;           blob: name NUL uuid(16) */
    MEDUSA_EV_ALLOC = 3,        /* u: addr, size, stream, flags */
    MEDUSA_EV_FREE = 4,         /* u: addr, size (0 if unknown), stream, alloc_seq */
    MEDUSA_EV_HOST_ALLOC = 5,   /* u: host, size, flags, device (its device address if mapped) */
    MEDUSA_EV_HOST_FREE = 6,    /* u: host, size, 0, alloc_seq (a HOST_ALLOC freed or, after a
                                   successful unregister, a HOST_REGISTER ended) */
    MEDUSA_EV_HOST_REGISTER = 7,/* u: host, size, flags, device */
    MEDUSA_EV_VMM_RESERVE = 8,  /* u: addr, size, alignment, requested */
    MEDUSA_EV_VMM_FREE = 9,     /* u: addr, size */
    MEDUSA_EV_VMM_CREATE = 10,  /* u: handle, size, location (device ordinal or -1 for host) */
    MEDUSA_EV_VMM_RELEASE = 11, /* u: handle */
    MEDUSA_EV_VMM_MAP = 12,     /* u: addr, size, offset, handle */
    MEDUSA_EV_VMM_UNMAP = 13,   /* u: addr, size */
    MEDUSA_EV_LOAD = 14,        /* u: handle, size, is_library, hash[4] (sha256 of the image), the
                                   library's module (cuLibraryGetModule) or 0;
                                   blob: the file name for cuModuleLoad/cuLibraryLoadFromFile */
    MEDUSA_EV_FUNC = 15,        /* u: func, library, module, num_params, param_bytes;
                                   blob: u32 (offset, size) per param, then the mangled name */
    MEDUSA_EV_STUB = 16,        /* u: stub, func;  blob: exported symbol NUL object path */
    MEDUSA_EV_GLOBAL = 17,      /* u: addr, size, owner (module or library);  blob: name */
    MEDUSA_EV_FUNC_ATTR = 18,   /* u: func, attr, value */
    MEDUSA_EV_LAUNCH = 19,      /* u: func, stream, node, grid, block, shared (below);
                                   blob: the raw parameter bytes, laid out at their offsets */
    MEDUSA_EV_CAPTURE_BEGIN = 20, /* u: stream, mode */
    MEDUSA_EV_CAPTURE_END = 21,   /* u: stream, graph, num_nodes, num_edges */
    MEDUSA_EV_NODE = 22,        /* u: graph, node, type | index << 32, then by type (below);
                                   blob: kernel params (kernel) */
    MEDUSA_EV_EDGE = 23,        /* u: graph, from, to, from_port, to_port, type */
    MEDUSA_EV_NODE_ATTR = 24,   /* u: node, attr;  blob: the CUkernelNodeAttrValue bytes */
    MEDUSA_EV_INSTANTIATE = 25, /* u: graph, exec, flags */
    MEDUSA_EV_GRAPH_LAUNCH = 26,/* u: exec, stream */
    MEDUSA_EV_MARK = 27,        /* blob: phase name */
    MEDUSA_EV_PAUSE = 28,
    MEDUSA_EV_RESUME = 29,
    MEDUSA_EV_END = 30,         /* u: next sequence number (the number of records + 1) */
    MEDUSA_EV_APIS = 31,        /* u: count;  blob: the names of `api` values, NUL separated */
    MEDUSA_EV_CONTENT = 32,     /* u: addr, size, alloc_seq;  blob: the allocation's bytes, read when
                                   the "ready" phase is marked, for allocations made since the
                                   capture phase began (a graph's permanent buffers) */
    MEDUSA_EV_STOPPED = 33,     /* blob: why the recorder stopped: the trace cannot make an artifact */
    MEDUSA_EV_ACCESS = 34,      /* u: func, node (the graph node the kernel ran as, 0 when eager:
                                   then its LAUNCH record follows), num_extents, granularity (bytes;
                                   extents are whole granules), flags (1: incomplete);
                                   blob: num_extents x u64 (lo, hi, access: 1 read | 2 write) */
} medusa_event_type;

/* MEDUSA_EV_LAUNCH payload, in u[]: func, stream, node (the graph node it became while capturing,
 * else 0), grid x | y << 32, grid z | block x << 32, block y | block z << 32, shared_bytes.
 * MEDUSA_EV_NODE payload: graph, node, type | index << 32, then by type in u[3..7]:
 *   kernel: func, grid x | y << 32, grid z | block x << 32, block y | block z << 32, shared_bytes;
 *   memcpy: dst, src, width_bytes, height | depth << 32, src_type | dst_type << 8 (CUmemorytype);
 *   memset: dst, value, element_size, width, height. */

#define MEDUSA_ALLOC_ASYNC 0x1u
#define MEDUSA_ALLOC_MANAGED 0x2u

typedef struct {
    uint16_t type;    /* medusa_event_type */
    uint16_t api;     /* the hooked entry point, an index into the interposer's symbol list */
    int32_t result;   /* the call's CUresult / cudaError_t */
    uint64_t seq;     /* global sequence number, 1-based, in the order calls returned */
    uint64_t t_ns;    /* monotonic nanoseconds since recording started */
    uint64_t blob;    /* offset in PATH.blobs of this record's blob, 0 if none */
    uint64_t u[8];    /* payload, by type (above) */
} medusa_trace_record;

_Static_assert(sizeof(medusa_trace_header) == MEDUSA_TRACE_HEADER_SIZE, "header size");
_Static_assert(sizeof(medusa_trace_record) == MEDUSA_TRACE_RECORD_SIZE, "record size");

/* The control API, exported by libmedusa_interpose.so (medusa.trace in Python calls it). */
int medusa_trace_active(void);           /* 1 when a trace is being written */
void medusa_trace_pause(void);           /* stop recording (calls pass through) */
void medusa_trace_resume(void);
void medusa_trace_mark(const char *phase); /* a start-up phase begins here */
int medusa_trace_flush(void);            /* 0 when buffered records reached the file */
/* Environment: MEDUSA_TRACE=path, MEDUSA_MODE=record|restore, MEDUSA_TRACE_SHIFT=bytes (after the
 * first device allocation, hold that many bytes so that later addresses move: the second
 * recording of a materialization shifts the layout this way). */
const char *medusa_trace_api_name(unsigned api); /* the name of a record's `api` */
/* An instrumented back-end reports a kernel run's accesses: extents as (lo, hi, access) triples. */
void medusa_trace_access(const void *func, const void *node, const uint64_t *extents,
                         size_t num_extents, uint64_t granularity, uint64_t flags);

#endif
