"""Owns all device work: weights (medusa.engine.runner_weights), activations, the KV cache, the
forward pass (medusa.engine.forward), decode graphs and prefill graphs
(medusa.engine.prefill_graphs); batches are built in medusa.engine.batches. Allocations happen in
one fixed order for a given configuration, so that a recording of one start-up lines up with the
next."""

from __future__ import annotations

import time
from collections.abc import Callable, Container

import numpy as np

from medusa.engine.batches import Batch, BatchBuilder, upload
from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.forward import Forward, workspace_sizes
from medusa.engine.kv_cache import KVCache, make_kv_cache
from medusa.engine.kv_size import KVSize, blocks_that_fit
from medusa.engine.layer_gate import LayerGate
from medusa.engine.prefill_graphs import PrefillGraphs
from medusa.engine.runner_weights import RunnerWeights
from medusa.engine.sequence import Sequence
from medusa.engine.spec import ModelSpec
from medusa.engine.tensor_parallel import TPGroup, TPRank


class ModelRunner:
    """The objects it owns: `weights` (RunnerWeights), `batches` (BatchBuilder), `forward`
    (Forward), the workspace buffers `ws`, the KV cache, the decode graphs and `prefill`
    (PrefillGraphs)."""

    def __init__(
        self, config: EngineConfig, spec: ModelSpec, device: Device, tp: TPRank | None = None
    ) -> None:
        """tp: this process's rank of a tensor-parallel group; the runner then holds the rank's
        shard (medusa.engine.tensor_parallel) and `spec` becomes the rank's."""
        self.tp = TPGroup(tp, device, spec) if tp is not None else None
        if self.tp is not None:
            spec = self.tp.shard.spec(spec)
        self.config, self.spec, self._dev = config, spec, device
        self.weights = RunnerWeights(config, spec, device)
        if self.tp is not None:
            self.weights.shapes = self.tp.shard.weight_shapes(spec)
        self.batches = BatchBuilder(config)
        self.ws: dict[str, Buffer] = {}  # NOTE: filled and emptied in place: forward reads it
        self.forward = Forward(config, spec, self.weights, self.ws, device)
        self.forward.tp = self.tp
        self.kv: Buffer | None = None
        self.kv_cache: KVCache | None = None
        self.num_blocks = 0
        self.graphs: dict[int, int] = {}  # batch size -> graph exec
        self.graph_out: dict[int, Buffer] = {}
        self._own_graph_out: list[Buffer] = []
        self.segments: dict[int, list[int]] = {}  # batch size -> a woven step's graph execs
        self.prefill = PrefillGraphs(self)
        self.capture_seconds: dict[str, float] = {}  # decode, prefill: what capture_graphs took

    @property
    def dev(self) -> Device:
        return self._dev

    @dev.setter
    def dev(self, device: Device) -> None:
        """Another device for all of the runner's work from now on (one that wraps this one:
        Weaver's polling device, a timing one)."""
        self._dev = self.weights.dev = self.forward.dev = device

    @property
    def gate(self) -> LayerGate | None:
        """While a store's weights arrive (serve while loading): RunnerWeights.gate."""
        return self.weights.gate

    @property
    def alphas(self) -> list[float]:
        """HybridGEMM's per-layer split, changed in place between steps (C2C's tuner)."""
        return self.weights.alphas

    @property
    def block_bytes(self) -> int:
        return self.forward.block_bytes

    def settle_weights(self) -> None:
        self.weights.settle()

    # ---- start-up stages ----
    def allocate_workspace(self) -> None:
        sizes = workspace_sizes(self.config, self.spec, self.tp)
        self.ws.update({k: self.dev.alloc(v) for k, v in sizes.items()})

    def profile_kv(self) -> KVSize:
        """Runs a forward pass at the largest batch on a throwaway cache, measures what it holds
        at its end beyond what was held before it (its peak: nothing here frees mid-pass), and
        sizes the KV cache by medusa.engine.kv_size's rule (KVCacheTooSmall if one sequence at
        max_model_len does not fit)."""
        c = self.config
        t, n = c.max_num_batched_tokens, c.max_num_seqs
        lens = [t // n + (1 if i < t % n else 0) for i in range(n)]
        blocks = [-(-x // c.block_size) for x in lens]
        free, total = self.dev.mem_info()
        tmp_bytes = sum(blocks) * self.block_bytes
        tmp = self.dev.alloc(tmp_bytes)  # a throwaway cache for the pass
        starts = np.cumsum([0] + blocks)
        tables = [list(range(starts[i], starts[i + 1])) for i in range(n)]
        batch = self.batches.prefill([[0] * x for x in lens], tables, [(0.0, 1.0, 0)] * n)
        self.run_batch(batch, tmp, self.ws["tokens"])
        self.dev.synchronize()
        free_at_peak, _ = self.dev.mem_info()
        self.dev.free(tmp)
        # NOTE: the cache's allocation rounding counts in the peak, as the old non_kv did
        peak = max(free - free_at_peak - tmp_bytes, 0)
        num, inputs = blocks_that_fit(c, self.block_bytes, free=free, total=total, peak=peak)
        return KVSize(num, self.block_bytes, "profiled", {**inputs, "free_at_peak": free_at_peak})

    def allocate_kv(self, num_blocks: int) -> None:
        """A static allocation, or (kv_memory="elastic") a reserved range of that size whose
        pages are mapped as blocks are used."""
        self.kv_cache = make_kv_cache(self.config, self.dev, num_blocks, self.block_bytes)
        self.kv, self.num_blocks = self.kv_cache.buffer, num_blocks

    def capture_graphs(self) -> None:
        """Warms up and captures the decode step at each configured batch size, then the
        prefill step at each token bucket."""
        self.settle_weights()  # NOTE: a captured wait on the load's event would outlive it
        t0 = time.perf_counter()
        for size in sorted(self.config.graph_sizes, reverse=True):
            out = self.graph_out[size] = self.dev.alloc(size * 4)
            self._own_graph_out.append(out)
            batch = self.batches.padding(size)
            self.graphs[size] = self.capture_step(batch, batch.num_tokens, size, out, warm=True)
        t1 = time.perf_counter()
        self._own_graph_out += self.prefill.capture(warm=not self.graphs)
        self.capture_seconds = {"decode": t1 - t0, "prefill": time.perf_counter() - t1}

    def trigger(self) -> None:
        """The triggering step of a restore: the first layer of a decode step, eagerly, so that
        libraries which load their kernels on first use (mblas, like cuBLAS) do so."""
        size = min(self.config.graph_sizes, default=1)
        self._upload(self.batches.padding(size))
        self.weights.gated(lambda: self.forward.run(size, size, self.kv, self.ws["tokens"], 1))
        self.dev.synchronize()

    def adopt_graphs(
        self, execs: list[int], outs: list[int], sizes: list[int], prefill: list[int]
    ) -> None:
        """Takes restored graphs (and their output buffers), in capture order: the decode
        graphs (by batch size), then the prefill graphs (by tokens)."""
        n = len(sizes)
        self.prefill.adopt(execs[n:], outs[n:], prefill)
        for exec_, out, size in zip(execs[:n], outs[:n], sizes, strict=True):
            self.graphs[size] = exec_
            self.graph_out[size] = Buffer(out, size * 4)

    def probe(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """One decode step on a probe input, eagerly and by graph replay: (tokens, logits), each
        stacked as [eager, graph]."""
        if self.kv_cache is None:
            raise RuntimeError("the KV cache is not allocated yet")
        bs = self.config.block_size
        with self.kv_cache.scratch_block() as block:  # NOTE: never a live sequence's block
            batch = self.batches.padding(size)
            batch.ids[:] = np.arange(size) + 17
            batch.seq_lens[:] = 1
            batch.block_tables[:, 0] = block
            batch.slots[:] = block * bs + np.arange(size) % bs
            eager = self.run_batch(batch, self.kv, self.ws["tokens"])
            eager_logits = self.last_logits(size).copy()
            graph = self.replay_step(self.graphs[size], batch, self.graph_out[size], size)
        return np.array([eager, graph]), np.stack([eager_logits, self.last_logits(size)])

    def drop_graphs(self) -> None:
        self.drop_segments()
        self.prefill.destroy()
        for exec_ in self.graphs.values():
            self.dev.destroy_exec(exec_)
        for buf in self._own_graph_out:
            self.dev.free(buf)
        self.graphs, self.graph_out, self._own_graph_out = {}, {}, []

    def free_kv(self) -> None:
        if self.kv_cache is not None:
            self.kv_cache.release()
        self.kv, self.kv_cache = None, None

    def release(self) -> None:
        """Frees everything this runner allocated (graphs, KV cache, workspace, weights)."""
        self.drop_segments()
        self.weights.close_gate()  # NOTE: the engine waits for the load before this frees
        self.prefill.destroy()
        for exec_ in self.graphs.values():
            self.dev.destroy_exec(exec_)
        # NOTE: restored graphs' output buffers belong to the restorer, not to this runner.
        self.free_kv()
        bufs = [*self._own_graph_out, *self.ws.values()]
        for buf in bufs:
            self.dev.free(buf)
        self.weights.release()
        self.graphs, self.graph_out, self._own_graph_out = {}, {}, []
        self.ws.clear()
        if self.tp is not None:
            self.tp.close()

    # ---- steps ----
    def execute(self, seqs: list[Sequence], is_prefill: bool) -> list[int]:
        if is_prefill:
            batch = self.batches.prefill(
                [s.token_ids[s.num_computed : s.num_computed + s.chunk] for s in seqs],
                [s.block_table for s in seqs],
                self.batches.sampling(seqs),
                [s.num_computed for s in seqs],
            )
            tokens = self.prefill.bucket(batch.num_tokens, batch.num_seqs)
            self.prefill.count(tokens)
            if tokens is not None:
                return self.prefill.replay(batch, tokens)
            return self.run_batch(batch, self.kv, self.ws["tokens"])[: len(seqs)]
        size = next((g for g in sorted(self.graphs) if g >= len(seqs)), None)
        batch = self.batches.decode(seqs, size or len(seqs))
        if size is None:
            return self.run_batch(batch, self.kv, self.ws["tokens"])[: len(seqs)]
        return self.replay_step(self.graphs[size], batch, self.graph_out[size], len(seqs))

    def execute_woven(
        self, seqs: list[Sequence], remote: Container[int], after_attention: Callable[[int], None]
    ) -> list[int]:
        """A decode step whose rows `remote` attend elsewhere (Weaver): they get no local slot and
        no local attention, and after_attention(layer) writes their output. At a graph size it
        replays the step's segments (captured at the first such step), else runs eagerly."""
        size = next((g for g in sorted(self.graphs) if g >= len(seqs)), None)
        if size is None:
            batch = self.batches.decode(seqs, len(seqs), remote)
            return self.run_batch(batch, self.kv, self.ws["tokens"], after_attention)
        self.weights.settle()
        self.weights.check_usable()
        if size not in self.segments:
            self.segments[size] = self._capture_segments(size)
        self._upload(self.batches.decode(seqs, size, remote))
        *layers, last = self.segments[size]
        for i, exec_ in enumerate(layers):
            self.dev.replay(exec_)
            after_attention(i)  # NOTE: it synchronizes before it reads the layer's q/k/v
        self.dev.replay(last)
        self.dev.synchronize()
        return self.dev.download(self.graph_out[size], np.int32, size)[: len(seqs)].tolist()

    def _capture_segments(self, size: int) -> list[int]:
        """The decode step at `size` as graphs cut after each layer's attention: num_layers + 1
        of them, the host's work (Weaver's exchange) between two replays."""
        execs: list[int] = []

        def cut(layer: int) -> None:
            execs.append(self.dev.instantiate(self.dev.end_capture()))
            self.dev.begin_capture()

        self._upload(self.batches.padding(size))
        self.dev.synchronize()
        self.dev.begin_capture()
        self.forward.run(size, size, self.kv, self.graph_out[size], after_attention=cut)
        execs.append(self.dev.instantiate(self.dev.end_capture()))
        return execs

    def drop_segments(self) -> None:
        for exec_ in (e for execs in self.segments.values() for e in execs):
            self.dev.destroy_exec(exec_)
        self.segments = {}

    def last_logits(self, num_seqs: int) -> np.ndarray:
        """The logits the last step sampled from, [num_seqs, vocab]."""
        v = self.spec.vocab_size
        return self.dev.download(self.ws["logits"], np.float32, num_seqs * v).reshape(num_seqs, v)

    def _upload(self, batch: Batch) -> None:
        upload(self.dev, self.ws, batch)
        if self.tp is not None:
            self.tp.upload_unshard(self.ws, batch.num_seqs)

    def capture_step(self, batch: Batch, tokens: int, seqs: int, out: Buffer, warm: bool) -> int:
        """A graph (its exec) of one step of `batch` ran as `tokens` tokens of `seqs` sequences,
        sampling into `out`; `warm`: run it eagerly first (the lazy modules load)."""
        self._upload(batch)
        if warm:
            self.forward.run(tokens, seqs, self.kv, out)
            self.dev.synchronize()
        self.dev.begin_capture()
        self.forward.run(tokens, seqs, self.kv, out)
        return self.dev.instantiate(self.dev.end_capture())

    def replay_step(self, exec_: int, batch: Batch, out: Buffer, count: int) -> list[int]:
        """One step of `batch` by graph `exec_`: the first `count` tokens it sampled into `out`."""
        self.weights.settle()
        self.weights.check_usable()
        self._upload(batch)
        self.dev.replay(exec_)
        self.dev.synchronize()
        return self.dev.download(out, np.int32, count).tolist()

    def run_batch(
        self,
        batch: Batch,
        kv: Buffer | None,
        out: Buffer,
        after_attention: Callable[[int], None] | None = None,
    ) -> list[int]:
        if batch.num_tokens > self.config.max_num_batched_tokens:
            raise ValueError(
                f"{batch.num_tokens} tokens in one step exceed max_num_batched_tokens="
                f"{self.config.max_num_batched_tokens}"
            )
        """One step of `batch`, eagerly: its sampled tokens (written to `out` on the device)."""
        self._upload(batch)
        self.weights.gated(lambda: self.forward.run(batch.num_tokens, batch.num_seqs, kv, out,
                                                    after_attention=after_attention))  # fmt: skip
        self.dev.synchronize()
        if self.weights.gate is not None and self.weights.gate.complete:
            self.weights.settle()
        return self.dev.download(out, np.int32, batch.num_seqs).tolist()
