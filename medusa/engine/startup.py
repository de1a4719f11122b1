"""The engine's start-up paths, in the stages real engines have (each timed and logged): a
restore from an artifact, or the normal way (profile the KV cache, capture graphs); the weights'
stages are in medusa.engine.startup_weights. LLMEngine makes one and runs it."""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from medusa.artifact import Artifact, load_artifact
from medusa.engine.artifact_settings import graph_keys
from medusa.engine.config import EngineConfig
from medusa.engine.device import Device
from medusa.engine.kv_cache import KVCache, kv_cache_class
from medusa.engine.kv_size import KVSize, blocks_that_fit
from medusa.engine.loader import ModelSource
from medusa.engine.model_runner import ModelRunner
from medusa.engine.prefill_graphs import validate_graphs
from medusa.engine.startup_weights import WeightStartUp
from medusa.engine.tensor_parallel import TPRank, check_tensor_parallel
from medusa.engine.tokenizer import Tokenizer
from medusa.errors import MedusaError
from medusa.restore import RestoreError, Restorer
from medusa.restore.compat import check_compatible, device_fingerprint
from medusa.trace import control as trace
from medusa.weights import WeightStore

log = logging.getLogger("medusa.engine.startup")


class StartUp(WeightStartUp):
    """One engine's start-up (LLMEngine.startup): `run` builds the device, the weights' source,
    the runner and the tokenizer, restored or started the normal way; what it found (timings,
    restore_error, store_error, ...) stays here, and a store's load may settle after it, while
    the engine serves."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        require: bool,
        store_checked: str,
        restore_since: int,
        on_stage: Callable[[str], None] | None = None,
        tensor_parallel: TPRank | None = None,
    ) -> None:
        super().__init__(config, require=require, store_checked=store_checked, on_stage=on_stage)
        self._tp = tensor_parallel
        self.kv_profile: dict[str, int] = {}  # a profiled start's measurements (KVSize)
        self.kv_size: KVSize | None = None
        self.restored = False
        self.restore_error: str | None = None
        self.restore_methods: dict[str, int] = {}
        self.restorer: Restorer | None = None
        self._restore_since = restore_since

    def run(
        self,
        source: ModelSource | None,
        artifact: str | Path | Artifact | None,
        trust: str | Path | None,
        device: Device | None,
        store: str | Path | WeightStore | None,
        validate: bool,
    ) -> None:
        """The stages, in order (LLMEngine's arguments)."""
        t0 = time.perf_counter()
        loaded = self._load_artifact(artifact, trust)
        with self._stage("runtime_init"):
            self.device = device or Device()
            self.store = self._open_store(store, loaded)
            self.source = self._model_source(source)
            self.spec = self.source.spec
        art = self._check_artifact(loaded)
        if self._tp is not None:
            check_tensor_parallel(self.config, art, self.store)
        self.runner = ModelRunner(self.config, self.spec, self.device, self._tp)
        with self._stage("weights_alloc"):
            self.runner.weights.allocate(self.store)
        with self._stage("weights_load"):
            self._load_weights()
        try:
            self._after_weights(art, validate)
        except BaseException:
            if self._loading is not None:  # NOTE: no copy may outlive a failed start
                self._loading.wait_quietly()
            raise
        trace.mark("ready")
        self.timings["total"] = time.perf_counter() - t0
        kv = self.kv_size
        log.info("engine.startup total: %.2f s (%d KV blocks, %s; %d decode + %d prefill graphs%s)",
                 self.timings["total"], self.runner.num_blocks, kv.source if kv else "?",
                 len(self.runner.graphs), len(self.runner.prefill.graphs),
                 ", restored" if self.restored else "")  # fmt: skip

    def _after_weights(self, art: Artifact | None, validate: bool) -> None:
        with self._stage("tokenizer"):
            self.tokenizer: Tokenizer = self._tokenizer()
        with self._stage("workspace"):
            self.runner.allocate_workspace()
        # NOTE: waited for here, outside the restore's fallback (a failed copy fails the start;
        # it must never pass for a failed restore), and before any kernel runs: the restore's
        # trigger runs a layer to load hidden kernels, and it reads weights.
        if art is None or not self._gate_weights():
            self._weights_ready()
        if art is not None:
            try:
                self._restore(art, validate)
                self.restored = True
            except Exception as e:  # NOTE: any failure, of any type: undo it, fall back
                self._fall_back(f"restore failed: {_reason(e)}", self._require)
                self.runner.free_kv()
        if not self.restored:
            self.runner.weights.settle()
            self._start_normally()

    def wait_for_load(self) -> None:
        """Waits for a store's load that never settled (served while loading), its outcome
        unused: before the runner frees the buffers it copies into."""
        if self._loading is not None:
            self._loading.wait_quietly()
            self._loading = None

    def close(self) -> None:
        """Frees what the start-up holds beside the runner (the restorer's memory, the store)."""
        if self.restorer is not None:
            self.restorer.release(graphs=False)
        if self.store is not None:
            self.store.close()
            self.store = None

    def _start_normally(self) -> None:
        with self._stage("kv_profile"):
            if self.config.kv_cache_memory is None:
                kv = self.runner.profile_kv()
                self.kv_profile = kv.profile_record()
            else:
                kv = KVSize(self.config.kv_cache_memory // self.runner.block_bytes,
                            self.runner.block_bytes, "configured")  # fmt: skip
        self._allocate_kv(kv)
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

    def _allocate_kv(self, kv: KVSize) -> None:
        if self.runner.tp is not None:  # the ranks share one block table: the fewest blocks
            kv = dataclasses.replace(kv, num_blocks=self.runner.tp.agree_min(kv.num_blocks))
        log.info("%s", kv.describe())
        self.kv_size = kv
        with self._stage("kv_alloc"):
            self.runner.allocate_kv(kv.num_blocks)

    def _restore(self, art: Artifact, validate: bool) -> None:
        with self._stage("kv_restore"):  # NOTE: the stage's name stays: logs and docs know it
            kv = self._restored_kv_size(art.manifest["kv"])
        self._allocate_kv(kv)
        # NOTE: a static cache is the kv_alloc phase's one allocation; its size is this device's
        # (the graphs index it through block tables, data), every other allocation must match.
        resized = {} if self.runner_kv_class.maps_on_demand else {("kv_alloc", 0): kv.nbytes}
        with self._stage("graph_restore"):
            self.restorer = Restorer(art, self.device.b, since=self._restore_since,
                                     sizes=resized)  # fmt: skip
            self.runner.trigger()
            result = self.restorer.restore(self.device.stream)
            sizes, prefill = graph_keys(art.manifest["graphs"], self.config, len(result.execs))
            n = len(sizes) + len(prefill)
            outs = [self.restorer.address("graph_capture", i) for i in range(n)]
            self.runner.adopt_graphs(result.execs, outs, sizes, prefill)
            self.restore_methods = dict(result.methods)
        if validate:
            with self._stage("validate"):
                validate_graphs(self.runner, sizes, prefill)

    def _restored_kv_size(self, kv: dict[str, Any]) -> KVSize:
        """This device's block count: derived from the artifact's profiling peak and the memory
        free now (no forward pass), unless the cache is elastic (the recorded range, which its
        pages fill on demand), kv_cache_memory is given, or the artifact was materialized with
        one (no profiling peak recorded: the recorded count, if its memory is free)."""
        bb = self.runner.block_bytes
        if kv["block_bytes"] != bb:
            raise RestoreError(
                f"the artifact's KV blocks are {kv['block_bytes']} bytes, this engine's {bb}: "
                "materialize again"
            )
        elastic = self.runner_kv_class.maps_on_demand  # its graphs point into the recorded range
        if self.config.kv_cache_memory is not None and not elastic:
            return KVSize(self.config.kv_cache_memory // bb, bb, "configured")
        if elastic or "profile_peak_bytes" not in kv:
            if elastic and self.config.kv_cache_memory is not None:
                log.warning("kv_cache_memory is not used: an elastic cache restores the range "
                            "it was materialized with, its pages mapped on demand")  # fmt: skip
            self._check_kv_memory(kv)
            return KVSize(kv["num_blocks"], bb, "restored")
        free, total = self.device.mem_info()
        peak = kv["profile_peak_bytes"]
        num, inputs = blocks_that_fit(self.config, bb, free=free, total=total, peak=peak)
        return KVSize(num, bb, "derived", inputs)

    @property
    def runner_kv_class(self) -> type[KVCache]:
        return kv_cache_class(self.config.kv_memory)

    def _check_kv_memory(self, kv: dict[str, int]) -> None:
        """A static cache needs all of its memory free now; an elastic one (maps_on_demand) only
        reserves its range, and maps what the ledger (or the device) gives as requests come."""
        need = kv["num_blocks"] * self.runner.block_bytes
        free, _ = self.device.mem_info()
        if need <= free:
            return
        if self.runner_kv_class.maps_on_demand:
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


def _reason(e: Exception) -> str:
    """Our errors say what to do; anything else is named by its type too."""
    return str(e) if isinstance(e, MedusaError) else f"{e!r}"


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
