"""The manifest's schema, written once as data, and the small typed checker that applies it.

Every manifest is checked against MANIFEST before anything reads a field of it, so code that uses
the manifest may index it directly: a wrong type or a missing key is an ArtifactError here, never a
KeyError or TypeError later."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from medusa.artifact.errors import ArtifactError

U63 = 1 << 63
HEX64 = re.compile(r"[0-9a-f]{64}")
# NOTE: the only file names an artifact may list; anything else (.., /, another directory) is
# refused before it is used as a path.
FILE_NAME = re.compile(r"plan\.msgpack\.zst|images/[0-9a-f]{64}\.img")


class Spec:
    def check(self, value: Any, where: str) -> None:
        raise NotImplementedError


def _at(where: str, name: object) -> str:
    return f"{where}.{name}" if where else str(name)


def _fail(where: str, expected: str, value: Any) -> ArtifactError:
    got = type(value).__name__ if not isinstance(value, (int, str)) else repr(value)[:40]
    return ArtifactError(f"{where or 'the manifest'}: expected {expected}, got {got}")


@dataclass(frozen=True)
class Int(Spec):
    lo: int = 0
    hi: int = U63

    def check(self, value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(where, "an integer", value)
        if not self.lo <= value < self.hi:
            raise _fail(where, f"an integer in [{self.lo}, {self.hi})", value)


@dataclass(frozen=True)
class Num(Spec):
    def check(self, value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(where, "a number", value)
        if not math.isfinite(value):
            raise _fail(where, "a finite number", value)


@dataclass(frozen=True)
class Str(Spec):
    pattern: re.Pattern[str] | None = None
    max_len: int = 1 << 16

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, str) or len(value) > self.max_len:
            raise _fail(where, f"a string of at most {self.max_len} characters", value)
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise _fail(where, f"a string matching {self.pattern.pattern}", value)


@dataclass(frozen=True)
class Const(Spec):
    values: tuple[Any, ...]

    def check(self, value: Any, where: str) -> None:
        if isinstance(value, bool) or value not in self.values:
            raise _fail(where, f"one of {list(self.values)}", value)


@dataclass(frozen=True)
class Null(Spec):
    def check(self, value: Any, where: str) -> None:
        if value is not None:
            raise _fail(where, "null", value)


@dataclass(frozen=True)
class Either(Spec):
    options: tuple[Spec, ...]

    def check(self, value: Any, where: str) -> None:
        for s in self.options:
            try:
                s.check(value, where)
                return
            except ArtifactError:
                continue
        raise _fail(where, " or ".join(type(s).__name__ for s in self.options), value)


@dataclass(frozen=True)
class JSON(Spec):
    """Any JSON value: a section another module checks (the engine configuration, vLLM's)."""

    def check(self, value: Any, where: str) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise _fail(where, "a finite number", value)
        if isinstance(value, dict):
            for k, v in value.items():
                self.check(v, _at(where, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self.check(v, f"{where}[{i}]")


@dataclass(frozen=True)
class List(Spec):
    item: Spec
    max_len: int = 1 << 20

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, list) or len(value) > self.max_len:
            raise _fail(where, f"a list of at most {self.max_len} items", value)
        for i, v in enumerate(value):
            self.item.check(v, f"{where}[{i}]")


@dataclass(frozen=True)
class Map(Spec):
    """An object whose keys are data (file names, stage names), each value alike."""

    value: Spec
    key: Str = field(default_factory=Str)

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _fail(where, "an object", value)
        for k, v in value.items():
            self.key.check(k, f"{where} key")
            self.value.check(v, _at(where, k))


@dataclass(frozen=True)
class Obj(Spec):
    """An object with fixed keys; a key ending in '?' is optional. Unknown keys are refused."""

    fields: dict[str, Spec]

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _fail(where, "an object", value)
        known = {k.rstrip("?") for k in self.fields}
        for k in value:
            if k not in known:
                raise ArtifactError(f"{where or 'the manifest'}: unknown key {str(k)[:40]!r}")
        for k, spec in self.fields.items():
            name = k.rstrip("?")
            if name in value:
                spec.check(value[name], _at(where, name))
            elif not k.endswith("?"):
                raise ArtifactError(f"{where or 'the manifest'}: missing key {name!r}")


# NOTE: a file's stated size bounds what the loader reads and hashes (a sparse file costs no disk).
MAX_FILE_BYTES = 1 << 30
FILE = Obj({"sha256": Str(HEX64), "size": Int(hi=MAX_FILE_BYTES + 1), "raw_size?": Int()})
COMMON = {
    "schema": Int(),
    "medusa_version": Str(),
    "created_unix": Int(),
    "kind": Const(("engine", "command", "vllm")),
    "model": Obj({"identity": Str(), "name": Str(), "path?": Str()}),
    "engine": Map(JSON()),
    "device": Obj(
        {
            "name?": Str(),
            "total_mem?": Int(),
            "cc?": List(Int(), max_len=2),
            "driver_version?": Int(),
            "runtime_version?": Int(),
            "sm_count?": Int(),
        }
    ),
    "graphs": Obj(
        {
            "count": Int(),
            "keys": List(Either((Int(), Null()))),
            # an engine's: the prefill graphs' token buckets, captured after the decode graphs
            "prefill_keys?": List(Int()),
            "nodes": Int(),
            "templates": Int(),
        }
    ),
    "relocations": Map(Int()),
    "kernels": Obj({"count": Int(), "exported": Int(), "hidden": Int(), "images_saved": Int()}),
    "files": Map(FILE, key=Str(FILE_NAME)),
    "materialize_seconds?": Map(Num()),
    "baseline_startup?": Map(Num()),
}
KV = Obj(
    {
        "num_blocks": Int(),
        "block_bytes": Int(),
        # What the profiling start measured (medusa.engine.kv_size); absent when materialized
        # with kv_cache_memory. A restore derives its block count from profile_peak_bytes.
        "free_at_peak?": Int(),
        "kv_budget?": Int(),
        "non_kv_bytes?": Int(),
        "held_bytes?": Int(),
        "profile_peak_bytes?": Int(),
        "total?": Int(),
        # kv_memory="elastic": the reserved range the graphs point into, its page size, and the
        # page budget the materializing start-up had (the ledger's capacity, else the range's).
        "memory?": Const(("static", "elastic")),
        "reserve_bytes?": Int(),
        "page_bytes?": Int(),
        "budget_pages?": Int(),
    }
)
# NOTE: the store is not in `files`: loading an artifact hashes every listed file, and the store
# (hundreds of MiB to many GiB) is checked chunk by chunk while its weights load instead. The
# manifest seals its header, which holds every chunk's checksum.
STORE_NAME = re.compile(r"weights(\.r[1-9][0-9]?)?\.store")
WEIGHTS = Obj(
    {
        # weights.store; a tensor-parallel rank's: weights.rR.store (R >= 1; rank 0's is the first)
        "file": Str(STORE_NAME),
        "size": Int(),
        "header_sha256": Str(HEX64),
        "tensors": Int(),
        "data_bytes": Int(),
        "chunk_size": Int(),
        "chunks": Int(),
        "hash": Const(("xxh3_128",)),
    }
)
# A tensor-parallel engine's: the group's size and each rank's own sections (the top-level ones
# are rank 0's); the plan holds rank 0's plan and, under "ranks", every other rank's.
MAX_RANKS = 64
RANK = Obj(
    {"kv": KV, "graphs": COMMON["graphs"], "relocations": COMMON["relocations"],
     "device": COMMON["device"], "weights?": WEIGHTS}
)  # fmt: skip
TENSOR_PARALLEL = Obj({"size": Int(2, MAX_RANKS + 1), "ranks": List(RANK, max_len=MAX_RANKS)})
# One schema per kind of artifact: what `medusa materialize` writes for each.
MANIFEST = {
    "engine": Obj({**COMMON, "kv": KV, "weights?": WEIGHTS, "tensor_parallel?": TENSOR_PARALLEL}),
    "command": Obj(COMMON),
    "vllm": Obj({**COMMON, "vllm": Map(JSON())}),
}


def check_manifest(manifest: Any, source: str) -> None:
    """Raises ArtifactError naming the file and the field (`DIR/manifest.json: kv.num_blocks:
    expected an integer, got '12'`) unless the manifest matches the schema of its kind."""
    try:
        if not isinstance(manifest, dict):
            raise _fail("", "a JSON object", manifest)
        Const(tuple(MANIFEST)).check(manifest.get("kind"), "kind")
        MANIFEST[manifest["kind"]].check(manifest, "")
    except ArtifactError as e:
        raise ArtifactError(
            f"{source}: {e} (not a manifest this medusa wrote; materialize again)"
        ) from None
