"""The engine's start-up paths, in the stages real engines have (each timed and logged): a
restore from an artifact, or the normal way (profile the KV cache, capture graphs), and the
weights from a store (copied in the background) or from the model file. LLMEngine runs them."""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from medusa.artifact import Artifact, ArtifactError, load_artifact
from medusa.cuda import CudaError
from medusa.engine.config import EngineConfig
from medusa.engine.device import Device
from medusa.engine.loader import ModelSource, open_model
from medusa.engine.loader.stored import StoredModel, check_tensors
from medusa.engine.model_runner import ModelRunner
from medusa.restore import RestoreError, Restorer
from medusa.restore.compat import check_compatible, device_fingerprint
from medusa.trace import control as trace
from medusa.weights import WeightStore, WeightStoreError, open_store
from medusa.weights.sealed import open_vouched, seal_store

if TYPE_CHECKING:
    from medusa.engine.weight_load import WeightLoad

log = logging.getLogger("medusa.engine.startup")


class StartUp:
    """What LLMEngine.__init__ sets before it calls these."""

    config: EngineConfig
    timings: dict[str, float]
    kv_profile: dict[str, int]
    restore_error: str | None
    restore_methods: dict[str, int]
    store: WeightStore | None
    store_error: str | None
    restorer: Restorer | None
    device: Device
    source: ModelSource
    runner: ModelRunner
    _require: bool
    _store_checked: str
    _restore_since: int
    _loading: WeightLoad | None

    def _start_normally(self) -> None:
        with self._stage("kv_profile"):
            if self.config.kv_cache_memory is None:
                num_blocks, self.kv_profile = self.runner.profile_kv_blocks()
            else:
                num_blocks = self.config.kv_cache_memory // self.runner.block_bytes
        with self._stage("kv_alloc"):
            self.runner.allocate_kv(num_blocks)
        with self._stage("graph_capture"):
            self.runner.capture_graphs()

    def _load_artifact(
        self, path: str | Path | Artifact | None, trust: str | Path | None
    ) -> Artifact | None:
        if path is None or isinstance(path, Artifact):  # an Artifact: checked by whoever loaded it
            return path
        try:
            return load_artifact(Path(path), trust=trust)
        except Exception as e:  # NOTE: whatever is wrong, fall back (--require-artifact: exit)
            self._fall_back(_reason(e), self._require)
            return None

    def _check_artifact(self, art: Artifact | None) -> Artifact | None:
        if art is None:
            return None
        try:
            check_compatible(
                art.manifest,
                model_identity=self.source.identity(),
                config=asdict(self.config),
                device=device_fingerprint(self.device),
            )
            return art
        except Exception as e:  # NOTE: whatever is wrong, fall back (--require-artifact: exit)
            self._fall_back(_reason(e), self._require)
            return None

    # ---- weights ----
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
        this worker's own; else the file, read as it loads."""
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
                    return StoredModel.open(self.store, self.config.model)
                check_tensors(self.store, given.spec)
            except WeightStoreError as e:
                self._store_failed(str(e))
        return given or open_model(self.config.model)

    def _load_weights(self) -> None:
        """A store's weights copy in the background (device memory: a bad chunk found later
        reloads the same buffers from the model file, so nothing else depends on it); host-mapped
        ones are checked now, since a bad store there changes the allocations the restore
        replays. A model file loads now."""
        if self.store is not None:
            if not self.runner.maps_store:
                self._loading = self.runner.start_store_load(self.store)
                return
            try:
                with self.runner.staging():
                    self.runner.load_store(self.store)
                return
            except WeightStoreError as e:
                self._store_failed(str(e))
        with self.runner.staging():
            self.runner.load_weights(self._model_file().weights())

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

        gate = self.runner.gate_weights(self._loading, self.store, settle=self._weights_ready)
        with self._stage("weights_first_layer"):
            try:
                gate.embedding()
                gate.layer(0)
            except WeightsNotIn:  # the load's own error, and the fallback, come with settling
                self.runner.settle_weights()
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
                self.runner.finish_store_load(load)
            self._loading = None
        except WeightStoreError as e:
            self._loading = None
            self._store_failed(str(e))
            with self._stage(during + "weights_fallback"), self.runner.staging():
                self.runner.load_weights(self._model_file().weights())
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
        if getattr(self, "runner", None) is not None and self.runner.maps_store:
            log.warning(
                "weights=host: the model file's weights are allocated one by one instead of the "
                "store's one registration, so a restore of graphs recorded with the store will "
                "be refused and the engine captures them"
            )
            self.runner.release_weights()
            self.runner.allocate_weights(None)
        self.store.close()
        self.store = None

    def _fall_back(self, reason: str, require: bool) -> None:
        self.restore_error = reason
        if require:
            raise RestoreError(f"{reason} (--require-artifact: not starting the normal way)")
        log.warning("artifact not used, starting the normal way: %s", reason)
        if self.restorer is not None:
            self.runner.drop_graphs()
            self.restorer.release(graphs=False)
            self.runner.free_kv()
            self.restorer = None

    def _restore(self, art: Artifact, validate: bool) -> None:
        kv = art.manifest["kv"]
        with self._stage("kv_restore"):
            self._check_kv_memory(kv)
        with self._stage("kv_alloc"):
            self.runner.allocate_kv(kv["num_blocks"])
        with self._stage("graph_restore"):
            self.restorer = Restorer(art, self.device.b, since=self._restore_since)
            self.runner.trigger()
            result = self.restorer.restore(self.device.stream)
            sizes = art.manifest["graphs"]["keys"]
            outs = [self.restorer.address("graph_capture", i) for i in range(len(sizes))]
            self.runner.adopt_graphs(result.execs, outs, sizes)
            self.restore_methods = dict(result.methods)
        if validate:
            with self._stage("validate"):
                for size in sizes:
                    tokens, logits = self.runner.probe(size)
                    if not (
                        np.array_equal(tokens[0], tokens[1])
                        and np.array_equal(logits[0], logits[1])
                    ):
                        raise RestoreError(
                            f"validation: the restored decode graph for batch {size} gives other "
                            "outputs than eager execution on the probe input"
                        )

    def _check_kv_memory(self, kv: dict[str, int]) -> None:
        """A static cache needs all of its memory free now; an elastic one only reserves its
        range, and maps what the ledger (or the device) gives as requests come."""
        need = kv["num_blocks"] * self.runner.block_bytes
        free, _ = self.device.mem_info()
        if need <= free:
            return
        if self.config.kv_memory == "elastic":
            log.warning(
                "the artifact's KV cache was %.0f MiB and %.0f MiB are free: starting elastic, "
                "requests queue while pages are short",
                need / 2**20,
                free / 2**20,
            )
            return
        raise RestoreError(
            f"the artifact's KV cache needs {need / 2**20:.0f} MiB and {free / 2**20:.0f} MiB are "
            "free: another process holds device memory (kv_memory='elastic' starts anyway)"
        )

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        trace.mark(name)
        t0 = time.perf_counter()
        yield
        self.timings[name] = dt = time.perf_counter() - t0
        log.info("engine.startup %s: %.3f s", name, dt)


def _reason(e: Exception) -> str:
    """Our errors say what to do; anything else is named by its type too."""
    return str(e) if isinstance(e, (ArtifactError, RestoreError, CudaError)) else f"{e!r}"


F = TypeVar("F", bound=Callable[..., Any])


def without_gc(start: F) -> F:
    """Runs a start-up with the cyclic garbage collector paused, then freezes what it built.

    A start-up allocates hundreds of thousands of objects that live as long as the engine (the
    tokenizer's vocabulary and merges, the artifact's plan, the trace the restore reads): the
    collector ran 72 times over them (once in full), 28-39 ms of a 0.3 s restored start of
    SmolLM2. gc.freeze() then moves them out of the collector's sight, so the first requests do
    not pay one walk over them instead (vLLM freezes after its graph capture too). Garbage the
    start-up made stays frozen with it until LLMEngine.shutdown unfreezes: bounded, made once."""

    @functools.wraps(start)
    def run(*args: Any, **kwargs: Any) -> Any:
        was_on = gc.isenabled()
        gc.disable()
        try:
            started = start(*args, **kwargs)
            gc.freeze()  # NOTE: a failed start's objects are garbage: they stay collectable
            return started
        finally:
            if was_on:
                gc.enable()

    return run  # type: ignore[return-value]
