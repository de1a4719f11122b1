"""vLLM's graph keys (BatchDescriptor for PIECEWISE entries, BatchExecutionDescriptor for V2 FULL
graphs) to and from the plain dicts an artifact stores."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


def descriptor_key(desc: Any) -> dict[str, Any]:
    """A JSON/msgpack-able dict of a descriptor (NamedTuple or dataclass); enums by name."""
    if hasattr(desc, "_asdict"):
        fields = dict(desc._asdict())
    elif dataclasses.is_dataclass(desc):
        fields = {f.name: getattr(desc, f.name) for f in dataclasses.fields(desc)}
    else:
        raise TypeError(f"{type(desc).__qualname__} is not a vLLM batch descriptor")
    out = {}
    for k, v in fields.items():
        out[k] = {"enum": type(v).__qualname__, "name": v.name} if isinstance(v, enum.Enum) else v
    return {"type": type(desc).__qualname__, "fields": out}


def descriptor_from_key(cls: type, key: dict[str, Any], enums: dict[str, Any] | None = None) -> Any:
    """The descriptor of class cls a key stands for; refuses a key of another class or fields."""
    if key.get("type") != cls.__qualname__:
        raise ValueError(f"artifact graph key is a {key.get('type')}, expected {cls.__qualname__}")
    names = (
        list(cls._fields) if hasattr(cls, "_fields") else [f.name for f in dataclasses.fields(cls)]
    )
    fields = key["fields"]
    if set(fields) != set(names):
        raise ValueError(
            f"{cls.__qualname__} fields {sorted(names)} differ from the artifact's "
            f"{sorted(fields)}: the artifact is from another vLLM version"
        )
    values = {}
    for k, v in fields.items():
        if isinstance(v, dict) and "enum" in v:
            enum_cls = (enums or {}).get(v["enum"])
            if enum_cls is None:
                raise ValueError(f"{cls.__qualname__}.{k}: unknown enum {v['enum']}")
            v = enum_cls[v["name"]]
        values[k] = v
    return cls(**values)
