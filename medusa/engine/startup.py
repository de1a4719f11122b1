"""The engine's start-up paths, in the stages real engines have (each timed and logged): a
restore from an artifact, or the normal way (profile the KV cache, capture graphs); the weights'
stages are in medusa.engine.startup_weights. LLMEngine makes one and runs it."""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from medusa.artifact import Artifact, load_artifact
from medusa.engine.config import EngineConfig
from medusa.engine.device import Device
from medusa.engine.kv_size import KVSize
from medusa.engine.loader import ModelSource
from medusa.engine.model_runner import ModelRunner
from medusa.engine.startup_restore import RestoreSteps
from medusa.engine.tensor_parallel import TPRank, check_tensor_parallel
from medusa.engine.tokenizer import Tokenizer
from medusa.errors import MedusaError
from medusa.restore import Restorer
from medusa.restore.compat import check_compatible, device_fingerprint
from medusa.trace import control as trace
from medusa.weights import WeightStore

log = logging.getLogger("medusa.engine.startup")


class StartUp(RestoreSteps):
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
        super().__init__(config, require=require, store_checked=store_checked, on_stage=on_stage,
                         tensor_parallel=tensor_parallel)  # fmt: skip
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
            check_tensor_parallel(self.config)
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
        # NOTE: a tensor-parallel rank whose artifact was refused still takes the restore's
        # steps beside its peers (startup_restore): they all fall back together
        if art is not None or (self._tp is not None and self.restore_error is not None):
            try:
                self._restore(art, validate)
                self.restored = True
            except Exception as e:  # NOTE: any failure, of any type: undo it, fall back
                if art is not None:
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
        """This start's part of the artifact (a tensor-parallel rank's: its plan, its store)."""
        if path is None:
            return None
        tp = self._tp or TPRank(0, 1, b"")
        try:
            # an Artifact: checked by whoever loaded it
            art = path if isinstance(path, Artifact) else load_artifact(Path(path), trust=trust)
            return art.for_rank(tp.rank, tp.size)
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
