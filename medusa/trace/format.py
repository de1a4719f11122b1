"""The trace format (csrc/include/medusa/trace.h, version 1, minor 1): numpy dtypes, constants."""

from __future__ import annotations

from enum import IntEnum

import numpy as np

MAGIC = b"MEDUSATR"
BLOB_MAGIC = b"MEDUSABL"
VERSION = 1
MINOR = 1  # minor 1 added ACCESS records; a minor-0 trace reads the same
HEADER_SIZE = 64
RECORD_SIZE = 96


class Ev(IntEnum):
    """Record types (medusa_event_type)."""

    PROCESS = 1
    DEVICE = 2
    ALLOC = 3
    FREE = 4
    HOST_ALLOC = 5
    HOST_FREE = 6
    HOST_REGISTER = 7
    VMM_RESERVE = 8
    VMM_FREE = 9
    VMM_CREATE = 10
    VMM_RELEASE = 11
    VMM_MAP = 12
    VMM_UNMAP = 13
    LOAD = 14
    FUNC = 15
    STUB = 16
    GLOBAL = 17
    FUNC_ATTR = 18
    LAUNCH = 19
    CAPTURE_BEGIN = 20
    CAPTURE_END = 21
    NODE = 22
    EDGE = 23
    NODE_ATTR = 24
    INSTANTIATE = 25
    GRAPH_LAUNCH = 26
    MARK = 27
    PAUSE = 28
    RESUME = 29
    END = 30
    APIS = 31
    CONTENT = 32
    STOPPED = 33
    ACCESS = 34


class NodeType(IntEnum):
    """CUgraphNodeType values the recorder writes out in detail (others keep only their type)."""

    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2
    HOST = 3
    GRAPH = 4
    EMPTY = 5
    WAIT_EVENT = 6
    EVENT_RECORD = 7
    MEM_ALLOC = 10
    MEM_FREE = 11


class Mode(IntEnum):
    RECORD = 1
    RESTORE = 2


HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("header_size", "<u4"),
        ("record_size", "<u4"),
        ("pid", "<u4"),
        ("start_unix_ns", "<u8"),
        ("mode", "<u4"),
        ("minor", "<u4"),
        ("reserved", "V24"),
    ]
)

RECORD_DTYPE = np.dtype(
    [
        ("type", "<u2"),
        ("api", "<u2"),
        ("result", "<i4"),
        ("seq", "<u8"),
        ("t_ns", "<u8"),
        ("blob", "<u8"),
        ("u", "<u8", (8,)),
    ]
)

assert HEADER_DTYPE.itemsize == HEADER_SIZE and RECORD_DTYPE.itemsize == RECORD_SIZE

ALLOC_ASYNC = 0x1
