"""The engine's weight stages: the weights from a store (read as they are copied in the
background, or, for weights="host", a sealed copy registered in place) or from the model file;
any failure of a store falls back to the model file with the reason. StartUp builds on them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from medusa.engine.config import EngineConfig
from medusa.engine.device import Device
from medusa.engine.loader import ModelSource, open_model
from medusa.engine.loader.stored import StoredModel, check_tensors
from medusa.engine.model_runner import ModelRunner
from medusa.engine.tensor_parallel import TPRank, shard_weights
from medusa.restore import RestoreError
from medusa.trace import control as trace
from medusa.weights import WeightStore, WeightStoreError, open_store
from medusa.weights.sealed import open_vouched, seal_store

if TYPE_CHECKING:
    from medusa.artifact import Artifact
    from medusa.engine.tokenizer import Tokenizer
    from medusa.engine.weight_load import WeightLoad

log = logging.getLogger("medusa.engine.startup")


class WeightStartUp:
    """The weight stages of a start-up (StartUp builds on them). `run` sets device, source and
    runner before they are called."""

    device: Device
    source: ModelSource
    runner: ModelRunner

    def __init__(
        self,
        config: EngineConfig,
        *,
        require: bool,
        store_checked: str,
        on_stage: Callable[[str], None] | None = None,
        tensor_parallel: TPRank | None = None,
    ) -> None:
        """on_stage: called with each stage's name as it begins (a worker's /health says it).
        tensor_parallel: this process's rank (a store must hold its shard)."""
        self.config = config
        self._tp = tensor_parallel
        # the shard a store must hold: this rank's, or (one device) none
        self._shard = (tensor_parallel.rank, tensor_parallel.size) if tensor_parallel else None
        self._on_stage = on_stage
        self.timings: dict[str, float] = {}
        self.store: WeightStore | None = None
        self.store_error: str | None = None  # why a weight store was not used
        self._require = require
        self._store_checked = store_checked
        self._loading: WeightLoad | None = None  # a store's copy, running beside what follows

    def _open_store(
        self, path: str | Path | WeightStore | None, art: Artifact | None
    ) -> WeightStore | None:
        where, digest = path, None
        if where is None and art is not None and "weights" in art.manifest:
            where = art.path / art.manifest["weights"]["file"]
            digest = art.manifest["weights"]["header_sha256"]
        if where is None:
            return None
        store = None
        try:
            # a WeightStore: opened, and checked against the artifact, ahead (a pooled worker's)
            store = where if isinstance(where, WeightStore) else open_store(where, digest=digest)
            return self._in_memory(store)
        except (WeightStoreError, OSError) as e:
            if store is not None:
                store.close()
            self._store_failed(f"{e}" if isinstance(e, WeightStoreError) else f"{where}: {e}")
            return None

    def _in_memory(self, store: WeightStore) -> WeightStore:
        """The gateway's checked copy of `store` (MEDUSA_STORE_CHECKED) if it gave one; else,
        for weights="host" (the device reads the store's pages while serving), a sealed copy of
        this worker's own; else the file, read as it loads. A store given as that copy already
        (a pooled worker's, mapped at warm-up) is taken as it is."""
        if store.sealed and store.vouched:
            return store
        if self._store_checked:
            try:
                copy = open_vouched(int(self._store_checked), store.path, store.header.digest)
                log.info("%s: the gateway's sealed copy, checked in full: not hashed again",
                         store.path)  # fmt: skip
                store.close()
                return copy
            except (ValueError, WeightStoreError) as e:
                log.warning("the gateway's checked copy of the weight store is not used: %s", e)
        if self.config.weights == "host":
            return seal_store(store, check=False)
        return store

    def _model_source(self, given: ModelSource | None) -> ModelSource:
        if self.store is not None:
            try:
                if given is None:
                    return StoredModel.open(self.store, self.config.model, self._shard)
                check_tensors(self.store, given.spec, self._shard)
            except WeightStoreError as e:
                self._store_failed(str(e))
            except Exception as e:  # NOTE: the store is data: whatever fails, fall back
                self._store_failed(f"{self.store.path}: not usable ({e!r}); materialize again")
        return given or open_model(self.config.model)

    def _tokenizer(self) -> Tokenizer:
        """The source's tokenizer. A store's record that builds none refuses the store there:
        its load is waited for and the weights come from the model file, with the tokenizer."""
        try:
            return self.source.tokenizer()
        except WeightStoreError as e:
            if self._loading is not None:
                self._loading.wait_quietly()
                self._loading = None
            model = self._model_file()
            self._store_failed(str(e))
            self.source = model
            with self.runner.weights.staging():
                self.runner.weights.load_weights(self._file_weights(model))
            return model.tokenizer()

    def _load_weights(self) -> None:
        """A store's weights copy in the background (device memory: a bad chunk found later
        reloads the same buffers from the model file, so nothing else depends on it); host-mapped
        ones are checked now, since a bad store there changes the allocations the restore
        replays. A model file loads now."""
        if self.store is not None:
            if not self.runner.weights.maps_store:
                self._loading = self.runner.weights.start_store_load(self.store)
                return
            try:
                with self.runner.weights.staging():
                    self.runner.weights.load_store(self.store)
                return
            except WeightStoreError as e:
                self._store_failed(str(e))
        with self.runner.weights.staging():
            self.runner.weights.load_weights(self._file_weights(self._model_file()))

    def _file_weights(self, model: ModelSource) -> Iterator[tuple[str, np.ndarray]]:
        """The model file's weights, as this start holds them: a tensor-parallel rank's shard."""
        weights = model.weights()
        if self.runner.tp is not None:
            return shard_weights(weights, model.spec, self.runner.tp.shard)
        return iter(weights)

    def _gate_weights(self) -> bool:
        """Serve while loading (config.serve_while_loading), before a restore: instead of waiting
        for the whole copy, each part of the forward pass waits for its own weights
        (medusa.engine.layer_gate), and the engine is ready meanwhile. The embedding and layer 0,
        which the restore's trigger runs, are waited for here, outside the restore's fallback.
        Returns whether the weights are gated; if not, the caller waits for them."""
        on = self.config.serve_while_loading
        if on is None:
            # NOTE: not by default under --require-artifact, whose promise is that a start that
            # cannot use its artifact and store fails at start, not at its first request.
            on = self.device.kind != "sim" and not self._require
        if self._loading is None or self.store is None or not on:
            return False
        from medusa.engine.layer_gate import WeightsNotIn

        gate = self.runner.weights.gate_weights(
            self._loading, self.store, settle=self._weights_ready
        )
        with self._stage("weights_first_layer"):
            try:
                gate.embedding()
                gate.layer(0)
            except WeightsNotIn:  # the load's own error, and the fallback, come with settling
                self.runner.weights.settle()
        return True

    def _weights_ready(self) -> None:
        """Waits for a background store load (stage weights_wait; weights_copy is the copy's own
        time); a bad chunk: the model file's weights instead, into the same buffers."""
        load = self._loading
        if load is None:
            return
        # NOTE: settled while serving (the start-up is over): not a start-up stage
        during = "first_request_" if "total" in self.timings else ""
        try:
            with self._stage(during + "weights_wait"):
                self.runner.weights.finish_store_load(load)
            self._loading = None
        except WeightStoreError as e:
            self._loading = None
            self._store_failed(str(e))
            with self._stage(during + "weights_fallback"), self.runner.weights.staging():
                self.runner.weights.load_weights(self._file_weights(self._model_file()))
        finally:
            self.timings[during + "weights_copy"] = load.seconds

    def _model_file(self) -> ModelSource:
        """The model's own files (a store's model was only stat'ed)."""
        if isinstance(self.source, StoredModel):
            return open_model(self.source.path)
        return self.source

    def _store_failed(self, reason: str) -> None:
        """Stops using the store: the weights come from the model file (into the same device
        buffers; weights that pointed into the store's mapping get buffers of their own)."""
        self.store_error = reason
        if self._require:
            raise RestoreError(f"{reason} (--require-artifact: not starting the normal way)")
        log.warning("weight store not used, loading the model file: %s", reason)
        if self.store is None:
            return
        if getattr(self, "runner", None) is not None and self.runner.weights.maps_store:
            log.warning(
                "weights=host: the model file's weights are allocated one by one instead of the "
                "store's one registration, so a restore of graphs recorded with the store will "
                "be refused and the engine captures them"
            )
            self.runner.weights.release()
            self.runner.weights.allocate(None)
        self.store.close()
        self.store = None

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        trace.mark(name)
        if self._on_stage is not None:
            self._on_stage(name)
        t0 = time.perf_counter()
        yield
        self.timings[name] = dt = time.perf_counter() - t0
        log.info("engine.startup %s: %.3f s", name, dt)
