"""The engine's restore from an artifact, in steps (StartUp runs them after the weights).

Under tensor parallelism every rank restores its own plan, and the ranks agree after each step
(one all-reduce of who failed): a rank whose artifact could not be used, or whose step failed,
makes every rank fall back and start the normal way, together, so their collectives keep
meeting. A step runs a collective only first, before anything of its own that may fail, so a
failed rank is never missing from one: it goes straight to the agreement its peers reach next."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from medusa.engine.artifact_settings import graph_keys
from medusa.engine.kv_cache import KVCache, kv_cache_class
from medusa.engine.kv_size import KVSize, blocks_that_fit
from medusa.engine.prefill_graphs import validate_graphs
from medusa.engine.startup_weights import WeightStartUp
from medusa.restore import RestoreError, Restorer
from medusa.restore.validate import validate_plan

if TYPE_CHECKING:
    from medusa.artifact import Artifact

log = logging.getLogger("medusa.engine.startup")


class NotUsedHere(RestoreError):
    """This rank's artifact was refused before the restore (restore_error says why)."""


class RestoreSteps(WeightStartUp):
    """The restore's steps and the KV cache's sizing, shared by both ways to start (StartUp)."""

    restore_error: str | None
    restorer: Restorer | None
    kv_size: KVSize | None
    restore_methods: dict[str, int]
    _restore_since: int

    def _restore(self, art: Artifact | None, validate: bool) -> None:
        """Restores `art` (None: this rank's was refused, its peers' maybe not); raises what
        failed here, or RestoreError naming the rank that failed."""
        self._art, self._kv, self._validate = art, None, validate
        steps = (self._size_kv, self._allocate_restored_kv, self._restore_graphs,
                 self._validate_graphs)  # fmt: skip
        for step in steps:
            failed: Exception | None = NotUsedHere("not used") if art is None else None
            if failed is None:
                try:
                    step()
                except Exception as e:  # NOTE: any failure, of any type: every rank falls back
                    failed = e
            self._agree(failed)

    def _agree(self, failed: Exception | None) -> None:
        """Every rank at the same point: raises this rank's failure, or one naming the first
        rank that failed; returns if none did."""
        tp = self.runner.tp
        if tp is None:
            if failed is not None:
                raise failed
            return
        first = tp.agree_min(tp.rank if failed is not None else tp.size)
        if failed is not None:
            raise failed
        if first < tp.size:
            raise RestoreError(
                f"tensor-parallel rank {first} of {tp.size} could not restore (its log says "
                "why): every rank starts the normal way"
            )

    def _size_kv(self) -> None:
        assert self._art is not None
        if not self._art.plan_checked:  # checked whole here: the steps after cannot fail on it
            validate_plan(self._art.plan, str(self._art.path))
            self._art = dataclasses.replace(self._art, plan_checked=True)
        with self._stage("kv_restore"):  # NOTE: the stage's name stays: logs and docs know it
            self._kv = self._restored_kv_size(self._art.manifest["kv"])

    def _allocate_restored_kv(self) -> None:
        assert self._kv is not None
        self._allocate_kv(self._kv)

    def _restore_graphs(self) -> None:
        art, kv = self._art, self.kv_size
        assert art is not None and kv is not None
        # NOTE: a static cache is the kv_alloc phase's one allocation; its size is this device's
        # (the graphs index it through block tables, data), every other allocation must match.
        resized = {} if self.runner_kv_class.maps_on_demand else {("kv_alloc", 0): kv.nbytes}
        with self._stage("graph_restore"):
            self.restorer = Restorer(art, self.device.b, since=self._restore_since,
                                     sizes=resized)  # fmt: skip
            self.runner.trigger()  # NOTE: its first kernel may be a collective: first here
            result = self.restorer.restore(self.device.stream)
            sizes, prefill = graph_keys(art.manifest["graphs"], self.config, len(result.execs))
            n = len(sizes) + len(prefill)
            outs = [self.restorer.address("graph_capture", i) for i in range(n)]
            self.runner.adopt_graphs(result.execs, outs, sizes, prefill)
            self.restore_methods = dict(result.methods)
            self._keys = (sizes, prefill)

    def _validate_graphs(self) -> None:
        """Each graph against eager execution (with --validate): every rank replays every
        graph, and a rank's difference reaches every rank's logits, so all find it."""
        if self._validate:
            with self._stage("validate"):
                validate_graphs(self.runner, *self._keys)

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
