"""A model from its weight store: the spec and tokenizer the store carries, so a restored start
never parses the model file. The model file is only stat'ed, to tell that it is the one the store
was written from (and opened for its identity when its size or time changed)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from medusa.engine.loader import ModelSource, open_model
from medusa.engine.loader.spec_record import spec_from_record
from medusa.engine.loader.tokenizer_record import check_packed_tokenizer, tokenizer_from_record
from medusa.engine.spec import ModelSpec
from medusa.engine.tokenizer import Tokenizer
from medusa.weights import WeightStore, WeightStoreError


def fingerprint(path: Path) -> list[list[Any]]:
    """Name, size and modification time of the model's files (cheap: no file is read)."""
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    return [[p.name, st.st_size, st.st_mtime_ns] for p in files for st in [os.stat(p)]]


Shard = tuple[int, int]  # a tensor-parallel rank and its group's size


def model_record(source: ModelSource, shard: Shard | None = None) -> dict[str, Any]:
    """What a store says about its model: identity, spec, tokenizer, the files it came from, and
    (a tensor-parallel rank's store) the shard it holds: (rank, group size)."""
    return {
        "identity": source.identity(),
        "name": source.spec.name,
        "spec": dataclasses.asdict(source.spec),
        "tokenizer": source.tokenizer_record(),
        "source": fingerprint(source.path),
        **({"shard": {"rank": shard[0], "size": shard[1]}} if shard else {}),
    }


def _held(store: WeightStore) -> Shard | None:
    s = store.model.get("shard")
    if s is None:
        return None
    ok = isinstance(s, dict) and all(type(s.get(k)) is int for k in ("rank", "size"))
    if not ok or not 0 <= s["rank"] < s["size"] <= 64:
        raise WeightStoreError(f"{store.path}: its shard record {str(s)[:80]} is not a rank of "
                               "a group; materialize again")  # fmt: skip
    return s["rank"], s["size"]


def _what(shard: Shard | None) -> str:
    return "the whole model" if shard is None else f"rank {shard[0]} of {shard[1]}'s shard"


def store_shapes(spec: ModelSpec, shard: Shard | None) -> dict[str, tuple[int, ...]]:
    """The weights a store of `spec` holds, in load order: a rank's shard of them, or all."""
    if shard is None:
        return spec.weight_shapes()
    from medusa.engine.tensor_parallel import plan_shard

    part = plan_shard(spec, *shard)
    return part.weight_shapes(part.spec(spec))


def check_tensors(store: WeightStore, spec: ModelSpec, shard: Shard | None = None) -> None:
    """The store holds exactly the weights the spec lists (of SHARD, this start's rank and group
    size, when tensor-parallel), in its load order."""
    held = _held(store)
    if held != shard:
        raise WeightStoreError(f"{store.path}: holds {_what(held)}, this start needs "
                               f"{_what(shard)}; materialize again")  # fmt: skip
    want = [(n, tuple(s)) for n, s in store_shapes(spec, shard).items()]
    have = [(t.name, t.shape) for t in store.header.tensors]
    if want != have:
        raise WeightStoreError(
            f"{store.path}: holds {len(have)} tensors that are not the {len(want)} the model's "
            "spec lists, in its load order; materialize again"
        )


class StoredModel:
    """A ModelSource whose spec, tokenizer and weights come from a weight store."""

    def __init__(
        self, store: WeightStore, path: Path, identity: str, shard: Shard | None = None
    ) -> None:
        self.store, self.path, self._identity = store, path, identity
        where = f"{store.path}"
        try:
            self.spec = spec_from_record(store.model.get("spec"))
        except ValueError as e:
            raise WeightStoreError(f"{where}: its model record is not usable ({e}); "
                                   "materialize again") from None  # fmt: skip
        check_tensors(store, self.spec, shard)
        tok = store.tokenizer_record()  # NOTE: refused here, at open, not at the tokenizer stage
        if tok["kind"] == "bpe":
            try:
                check_packed_tokenizer(tok)
            except ValueError as e:
                raise WeightStoreError(f"{where}: its tokenizer record is not usable ({e}); "
                                       "materialize again") from None  # fmt: skip

    @classmethod
    def open(
        cls, store: WeightStore, model: str | Path | None, shard: Shard | None = None
    ) -> StoredModel:
        """The store's model, once the model MODEL names is known to be the store's (and its
        shard SHARD's, check_tensors)."""
        from medusa.engine.loader import locate_model

        path = locate_model(model)
        want = store.model.get("identity")
        if store.model.get("source") == fingerprint(path):
            return cls(store, path, str(want), shard)
        got = open_model(path).identity()  # the files changed on disk: compare what they hold
        if got != want:
            raise WeightStoreError(
                f"{store.path}: holds the weights of {store.model.get('name')!r} "
                f"({str(want)[:24]}…), the model here is {path} ({got[:24]}…)"
            )
        return cls(store, path, got, shard)

    def tokenizer(self) -> Tokenizer:
        """WeightStoreError naming the store if its record builds no tokenizer."""
        try:
            return tokenizer_from_record(self.store.tokenizer_record(), self.store.path)
        except Exception as e:  # NOTE: the record is the store's data: whatever fails, refuse it
            why = f"{type(e).__name__}: {e}"
            raise WeightStoreError(
                f"{self.store.path}: its tokenizer record builds no tokenizer ({why}); "
                "materialize again"
            ) from None

    def tokenizer_record(self) -> dict[str, Any]:
        return dict(self.store.tokenizer_record())

    def identity(self) -> str:
        return self._identity

    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        """The store's tensors, read unchecked (the loader checks chunks)."""
        for t in self.store.header.tensors:
            yield t.name, self.store.array(t)
