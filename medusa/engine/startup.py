"""The engine's start-up paths, in the stages real engines have (each timed and logged): a
restore from an artifact, or the normal way (profile the KV cache, capture graphs); the weights'
stages are in medusa.engine.startup_weights. LLMEngine runs them."""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from medusa.artifact import Artifact, ArtifactError, load_artifact
from medusa.cuda import CudaError
from medusa.engine.kv_cache import kv_cache_class
from medusa.engine.startup_weights import WeightStartUp
from medusa.restore import RestoreError, Restorer
from medusa.restore.compat import check_compatible, device_fingerprint

log = logging.getLogger("medusa.engine.startup")


class StartUp(WeightStartUp):
    """What LLMEngine.__init__ sets before it calls these."""

    kv_profile: dict[str, int]
    restore_error: str | None
    restore_methods: dict[str, int]
    restorer: Restorer | None
    _restore_since: int

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
        """A static cache needs all of its memory free now; an elastic one (maps_on_demand) only
        reserves its range, and maps what the ledger (or the device) gives as requests come."""
        need = kv["num_blocks"] * self.runner.block_bytes
        free, _ = self.device.mem_info()
        if need <= free:
            return
        if kv_cache_class(self.config.kv_memory).maps_on_demand:
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
