"""The recorder's trace: its format, a reader, a summary, and the in-process control API."""

from medusa.trace.control import (
    active,
    flush,
    interposer_path,
    mark,
    pause,
    paused,
    recorder_env,
    remove_trace,
    resume,
)
from medusa.trace.format import Ev, Mode, NodeType
from medusa.trace.reader import Trace, TraceError, read_trace
from medusa.trace.summary import summarize

__all__ = [
    "Ev",
    "Mode",
    "NodeType",
    "Trace",
    "TraceError",
    "active",
    "flush",
    "interposer_path",
    "mark",
    "pause",
    "paused",
    "read_trace",
    "recorder_env",
    "remove_trace",
    "resume",
    "summarize",
]
