"""Owns all device work: weights, activations, the KV cache, the forward pass and decode graphs.
Allocations happen in one fixed order for a given configuration, so that a recording of one
start-up lines up with the next."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from medusa.c2c.model import Tiles
from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.kv_cache import KVCache, make_kv_cache
from medusa.engine.layer_gate import LayerGate, WeightsNotIn
from medusa.engine.sequence import Sequence
from medusa.engine.spec import ModelSpec
from medusa.engine.weight_load import WeightLoad
from medusa.weights import WeightStore
from medusa.weights.loader import StagingRing

F32 = 4
# HybridGEMM tiles for the engine's projections (decode: M is the batch).
HOST_TILES = Tiles(bm=16, bn=64, bk=256, wbm=64, wbn=64, wbk=128)  # 32 KiB shared memory


@dataclass
class Batch:
    """A step's inputs, host side. Rows of per-sequence arrays beyond num_seqs are padding."""

    ids: np.ndarray  # int32 [tokens]
    positions: np.ndarray  # int32 [tokens]
    slots: np.ndarray  # int32 [tokens], -1: padding
    block_tables: np.ndarray  # int32 [seqs, max_blocks]
    seq_lens: np.ndarray  # int32 [seqs]
    query_start: np.ndarray  # int32 [seqs + 1]
    last_rows: np.ndarray  # int32 [seqs]
    temperature: np.ndarray  # float32 [seqs]
    top_p: np.ndarray  # float32 [seqs]
    seeds: np.ndarray  # uint64 [seqs]

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


class ModelRunner:
    def __init__(self, config: EngineConfig, spec: ModelSpec, device: Device) -> None:
        self.config, self.spec, self.dev = config, spec, device
        self.weights: dict[str, Buffer] = {}
        self.rope_table: Buffer | None = None  # float32 [rot_dim / 2]: RoPE's frequencies
        self._mapped: set[str] = set()  # weights that point into a registered store mapping
        self._registered: int | None = None  # the store mapping's host address, registered
        self._ring: StagingRing | None = None
        self.ws: dict[str, Buffer] = {}
        self.kv: Buffer | None = None
        self.kv_cache: KVCache | None = None
        self.num_blocks = 0
        self.graphs: dict[int, int] = {}  # batch size -> graph exec
        self.graph_out: dict[int, Buffer] = {}
        self._own_graph_out: list[Buffer] = []
        self.segments: dict[int, list[int]] = {}  # batch size -> a woven step's graph execs
        self.gate: LayerGate | None = None  # while a store's weights arrive (serve while loading)
        self._settle: Callable[[], None] | None = None
        self.unusable: str | None = None  # why the weights may not be read (a failed settle)

    # ---- start-up stages ----
    def allocate_weights(self, store: WeightStore | None = None) -> None:
        """On the device, or (weights="host") the projections and the embedding in host-mapped
        memory, read over C2C by HybridGEMM; norms stay on the device either way. With a store
        and weights="host", the 2-D weights are the store's own pages: its whole (shared,
        read-only) mapping is registered once and each weight points at its aligned offset."""
        host = self.config.weights == "host"
        offsets: dict[str, int] = {}  # 2-D weight -> its device address in the registered store
        if store is not None and host:
            base = self.dev.host_register(store.address, store.nbytes, read_only=True)
            self._registered = store.address
            data = base + store.header.data_offset
            offsets = {t.name: data + t.offset for t in store.header.tensors if len(t.shape) == 2}
        for name, shape in self.spec.weight_shapes().items():
            nbytes = int(np.prod(shape)) * F32
            if name in offsets:
                self.weights[name] = Buffer(offsets[name], nbytes)
                self._mapped.add(name)
            elif host and len(shape) == 2:
                self.weights[name] = self.dev.host_alloc(nbytes)
            else:
                self.weights[name] = self.dev.alloc(nbytes)
        self.rope_table = self.dev.alloc(self.spec.rope.rot_dim // 2 * F32)
        # Per-layer HybridGEMM split (the alpha controller may change them between steps).
        self.alphas = [self.config.alpha] * (self.spec.num_layers + 1)

    @contextmanager
    def staging(self) -> Iterator[None]:
        """The pinned slots weight uploads pass through, for the weights_load stage."""
        try:
            with StagingRing(self.dev.b, self.dev.stream) as self._ring:
                yield
        finally:
            self._ring = None

    def load_store(self, store: WeightStore, *, checked: bool = False) -> None:
        """Copies the device-resident weights from the store, every chunk checked (the mapped
        ones too) unless the gateway `checked` this file in full; WeightStoreError names a bad
        chunk, and the weights are then not usable."""
        if self._ring is None:
            raise RuntimeError("load_store runs inside staging()")
        self._ring.load_store(store, self._copied(), checked=checked)
        self._upload_rope()

    def start_store_load(self, store: WeightStore, *, checked: bool = False) -> WeightLoad:
        """load_store in the background (medusa.engine.weight_load): call finish_store_load
        with what this returns before anything reads a weight."""
        return WeightLoad(self.dev.b, store, self._copied(), checked=checked)

    def gate_weights(
        self, load: WeightLoad, store: WeightStore, settle: Callable[[], None]
    ) -> LayerGate:
        """Runs steps while `load` goes on, each part of the forward pass waiting for its own
        weights (medusa.engine.layer_gate). settle() finishes the load once all are in, or
        replaces its weights when it failed; it runs before any graph replay or capture."""
        self._upload_rope()
        self.gate = LayerGate(self.dev.b, load, store.header, set(self._copied()),
                              self.spec.num_layers, self.dev.stream)  # fmt: skip
        self._settle = settle
        return self.gate

    def settle_weights(self) -> None:
        """Every weight in (or the model file's, if the store's load failed): no more gating.
        If settling fails (--require-artifact, an unreadable model file), the weights are part
        copied: every later forward pass or replay raises instead of reading them."""
        gate, settle, self.gate, self._settle = self.gate, self._settle, None, None
        if gate is not None and settle is not None:
            gate.close()
            try:
                settle()
            except BaseException as e:
                self.unusable = f"the weights are not all in ({type(e).__name__}: {e})"
                raise

    def _check_usable(self) -> None:
        if self.unusable is not None:
            raise RuntimeError(f"{self.unusable}; start the engine again")

    def _gated(self, run: Callable[[], None]) -> None:
        try:
            run()
        except WeightsNotIn:
            # NOTE: what ran of this step read only checked chunks, but the store is given up:
            # every weight comes from the model file, and the step runs again from its start.
            self.settle_weights()
            run()

    def finish_store_load(self, load: WeightLoad) -> None:
        load.wait()
        self._upload_rope()

    def _copied(self) -> dict[str, int]:
        """The weights a store load copies (name -> device address): all but those that point
        into the registered store mapping."""
        return {n: b.ptr for n, b in self.weights.items() if n not in self._mapped}

    def load_weights(self, weights: Iterable[tuple[str, np.ndarray]]) -> None:
        if self._ring is None:
            raise RuntimeError("load_weights runs inside staging()")
        for name, arr in weights:
            self._ring.upload(self.weights[name].ptr, arr.astype(np.float32, copy=False))
        self._ring.synchronize()
        self._upload_rope()

    def _upload_rope(self) -> None:
        if self.rope_table is not None:
            self.dev.upload(self.rope_table, self.spec.rope.inv_freq())

    @property
    def maps_store(self) -> bool:
        """Whether weights point into a registered store mapping (weights="host" with a store)."""
        return self._registered is not None

    def release_weights(self) -> None:
        """Frees the weights (and unregisters a mapped store); allocate_weights may run again."""
        for name, buf in self.weights.items():
            if name not in self._mapped:
                self.dev.free(buf)
        if self._registered is not None:
            self.dev.host_unregister(self._registered)
        if self.rope_table is not None:
            self.dev.free(self.rope_table)
        self.weights, self._mapped, self._registered, self.rope_table = {}, set(), None, None

    def allocate_workspace(self) -> None:
        c, s = self.config, self.spec
        t, n = c.max_num_batched_tokens, c.max_num_seqs
        sizes = {
            "ids": t * 4,
            "positions": t * 4,
            "slots": t * 4,
            "x": t * s.hidden_size * F32,
            "h": t * s.hidden_size * F32,
            "qkv": t * s.qkv_size * F32,
            "attn": t * s.q_size * F32,
            "gate_up": t * 2 * s.intermediate_size * F32,
            "act": t * s.intermediate_size * F32,
            "block_tables": n * c.max_blocks_per_seq * 4,
            "seq_lens": n * 4,
            "query_start": (n + 1) * 4,
            "last_rows": n * 4,
            "last": n * s.hidden_size * F32,
            "last_h": n * s.hidden_size * F32,
            "logits": n * s.vocab_size * F32,
            "temperature": n * 4,
            "top_p": n * 4,
            "seeds": n * 8,
            "tokens": n * 4,
            "proj": t * s.hidden_size * F32,  # HybridGEMM output before a residual add
        }
        self.ws = {k: self.dev.alloc(v) for k, v in sizes.items()}

    @property
    def block_bytes(self) -> int:
        """One block of every layer's K and V: the cache is [block][layer][k|v][slot][head][dim]."""
        return 2 * self.spec.num_layers * self.layer_part

    @property
    def layer_part(self) -> int:
        """One layer's K (or V) rows of one block."""
        return self.config.block_size * self.spec.kv_size * F32

    def profile_kv_blocks(self) -> tuple[int, dict[str, int]]:
        """Runs a forward pass at the largest batch, measures what it leaves free, and returns the
        number of KV blocks that fit (and the measurements)."""
        c = self.config
        t, n = c.max_num_batched_tokens, c.max_num_seqs
        lens = [t // n + (1 if i < t % n else 0) for i in range(n)]
        blocks = [-(-x // c.block_size) for x in lens]
        tmp = self.dev.alloc(sum(blocks) * self.block_bytes)  # a throwaway cache for the pass
        starts = np.cumsum([0] + blocks)
        tables = [list(range(starts[i], starts[i + 1])) for i in range(n)]
        batch = self._prefill_batch([[0] * x for x in lens], tables, [(0.0, 1.0, 0)] * n)
        self._run(batch, tmp, self.ws["tokens"])
        self.dev.synchronize()
        free, total = self.dev.mem_info()
        self.dev.free(tmp)
        non_kv = total - free - sum(blocks) * self.block_bytes
        budget = int(total * c.gpu_memory_utilization) - non_kv
        num = budget // self.block_bytes
        stats = {"total": total, "free_at_peak": free, "non_kv_bytes": non_kv, "kv_budget": budget}
        if num < c.max_blocks_per_seq:
            raise MemoryError(
                f"the KV cache fits {max(num, 0)} blocks of {c.block_size} tokens, fewer than one "
                f"sequence of max_model_len={c.max_model_len} needs ({c.max_blocks_per_seq}): "
                f"raise gpu_memory_utilization ({c.gpu_memory_utilization}), lower max_model_len, "
                "or use a larger device"
            )
        return int(num), stats

    def allocate_kv(self, num_blocks: int) -> None:
        """A static allocation, or (kv_memory="elastic") a reserved range of that size whose
        pages are mapped as blocks are used."""
        self.kv_cache = make_kv_cache(self.config, self.dev, num_blocks, self.block_bytes)
        self.kv, self.num_blocks = self.kv_cache.buffer, num_blocks

    def capture_graphs(self) -> None:
        """Warms up and captures the decode step at each configured batch size."""
        self.settle_weights()  # NOTE: a captured wait on the load's event would outlive it
        for size in sorted(self.config.graph_sizes, reverse=True):
            out = self.graph_out[size] = self.dev.alloc(size * 4)
            self._own_graph_out.append(out)
            batch = self._padding_batch(size)
            self._upload(batch)
            self._forward(batch.num_tokens, size, self.kv, out)  # warm-up: lazy modules load here
            self.dev.synchronize()
            self.dev.begin_capture()
            self._forward(batch.num_tokens, size, self.kv, out)
            graph = self.dev.end_capture()
            self.graphs[size] = self.dev.instantiate(graph)

    def trigger(self) -> None:
        """The triggering step of a restore: the first layer of a decode step, eagerly, so that
        libraries which load their kernels on first use (mblas, like cuBLAS) do so."""
        size = min(self.config.graph_sizes, default=1)
        self._upload(self._padding_batch(size))
        self._gated(lambda: self._forward(size, size, self.kv, self.ws["tokens"], num_layers=1))
        self.dev.synchronize()

    def adopt_graphs(self, execs: list[int], outs: list[int], sizes: list[int]) -> None:
        """Takes restored graphs (and their output buffers), in capture order."""
        for exec_, out, size in zip(execs, outs, sizes, strict=True):
            self.graphs[size] = exec_
            self.graph_out[size] = Buffer(out, size * 4)

    def probe(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """One decode step on a probe input, eagerly and by graph replay: (tokens, logits), each
        stacked as [eager, graph]."""
        if self.kv_cache is None:
            raise RuntimeError("the KV cache is not allocated yet")
        bs = self.config.block_size
        with self.kv_cache.scratch_block() as block:  # NOTE: never a live sequence's block
            batch = self._padding_batch(size)
            batch.ids[:] = np.arange(size) + 17
            batch.seq_lens[:] = 1
            batch.block_tables[:, 0] = block
            batch.slots[:] = block * bs + np.arange(size) % bs
            eager = self._run(batch, self.kv, self.ws["tokens"])
            eager_logits = self.last_logits(size).copy()
            self.settle_weights()
            self._check_usable()
            self._upload(batch)
            self.dev.replay(self.graphs[size])
            self.dev.synchronize()
            graph = self.dev.download(self.graph_out[size], np.int32, size).tolist()
        return np.array([eager, graph]), np.stack([eager_logits, self.last_logits(size)])

    def drop_graphs(self) -> None:
        self.drop_segments()
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
        if self.gate is not None:  # NOTE: the engine waits for the load before this frees
            self.gate.close()
            self.gate, self._settle = None, None
        for exec_ in self.graphs.values():
            self.dev.destroy_exec(exec_)
        # NOTE: restored graphs' output buffers belong to the restorer, not to this runner.
        self.free_kv()
        bufs = [*self._own_graph_out, *self.ws.values()]
        for buf in bufs:
            self.dev.free(buf)
        self.release_weights()
        self.graphs, self.graph_out, self.ws = {}, {}, {}
        self._own_graph_out = []

    # ---- steps ----
    def execute(self, seqs: list[Sequence], is_prefill: bool) -> list[int]:
        if is_prefill:
            batch = self._prefill_batch(
                [s.token_ids[s.num_computed : s.num_computed + s.chunk] for s in seqs],
                [s.block_table for s in seqs],
                self._sampling(seqs),
                [s.num_computed for s in seqs],
            )
            return self._run(batch, self.kv, self.ws["tokens"])[: len(seqs)]
        size = next((g for g in sorted(self.graphs) if g >= len(seqs)), None)
        batch = self._decode_batch(seqs, size or len(seqs))
        if size is None:
            return self._run(batch, self.kv, self.ws["tokens"])[: len(seqs)]
        self.settle_weights()
        self._check_usable()
        self._upload(batch)
        self.dev.replay(self.graphs[size])
        self.dev.synchronize()
        return self.dev.download(self.graph_out[size], np.int32, size)[: len(seqs)].tolist()

    def execute_woven(
        self, seqs: list[Sequence], remote: Container[int], after_attention: Callable[[int], None]
    ) -> list[int]:
        """A decode step whose rows `remote` attend elsewhere (Weaver): they get no local slot and
        no local attention, and after_attention(layer) writes their output. At a graph size it
        replays the step's segments (captured at the first such step), else runs eagerly."""
        size = next((g for g in sorted(self.graphs) if g >= len(seqs)), None)
        if size is None:
            batch = self._decode_batch(seqs, len(seqs), remote)
            return self._run(batch, self.kv, self.ws["tokens"], after_attention)
        self.settle_weights()
        self._check_usable()
        if size not in self.segments:
            self.segments[size] = self._capture_segments(size)
        self._upload(self._decode_batch(seqs, size, remote))
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

        self._upload(self._padding_batch(size))
        self.dev.synchronize()
        self.dev.begin_capture()
        self._forward(size, size, self.kv, self.graph_out[size], after_attention=cut)
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

    # ---- batches ----
    def _sampling(self, seqs: list[Sequence]) -> list[tuple[float, float, int]]:
        return [
            (
                s.params.temperature,
                s.params.top_p,
                (s.seed * 0x9E3779B97F4A7C15 + s.num_completion_tokens) & (2**64 - 1),
            )
            for s in seqs
        ]

    def _meta(
        self, n: int, tables: list[list[int]], sampling: list[tuple[float, float, int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        bt = np.zeros((n, self.config.max_blocks_per_seq), np.int32)
        for i, t in enumerate(tables):
            bt[i, : len(t)] = t
        temp = np.zeros(n, np.float32)
        top_p = np.ones(n, np.float32)
        seeds = np.zeros(n, np.uint64)
        for i, (tp, pp, sd) in enumerate(sampling):
            temp[i], top_p[i], seeds[i] = tp, pp, sd
        return bt, temp, top_p, seeds

    def _slots(self, table: list[int], positions: Iterable[int]) -> list[int]:
        bs = self.config.block_size
        return [table[p // bs] * bs + p % bs for p in positions]

    def _prefill_batch(self, prompts, tables, sampling, starts=None) -> Batch:  # type: ignore[no-untyped-def]
        """A prefill of token runs; run i sits at positions starts[i] .. starts[i] + len - 1 (a
        chunk of a longer prompt whose earlier tokens are in the cache already)."""
        lens = [len(p) for p in prompts]
        starts = starts or [0] * len(prompts)
        qs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        slots = [
            x
            for n, t, s0 in zip(lens, tables, starts, strict=True)
            for x in self._slots(t, range(s0, s0 + n))
        ]
        bt, temp, top_p, seeds = self._meta(len(prompts), tables, sampling)
        return Batch(
            ids=np.concatenate([np.asarray(p, np.int32) for p in prompts]),
            positions=np.concatenate(
                [np.arange(s0, s0 + n, dtype=np.int32) for n, s0 in zip(lens, starts, strict=True)]
            ),
            slots=np.asarray(slots, np.int32),
            block_tables=bt,
            seq_lens=np.asarray([s0 + n for n, s0 in zip(lens, starts, strict=True)], np.int32),
            query_start=qs,
            last_rows=qs[1:] - 1,
            temperature=temp,
            top_p=top_p,
            seeds=seeds,
        )

    def _decode_batch(
        self, seqs: list[Sequence], size: int, remote: Container[int] = frozenset()
    ) -> Batch:
        n = len(seqs)
        bt, temp, top_p, seeds = self._meta(
            size, [[] if i in remote else s.block_table for i, s in enumerate(seqs)],
            self._sampling(seqs),
        )  # fmt: skip
        pos = [len(s) - 1 for s in seqs] + [0] * (size - n)
        lens = [0 if i in remote else len(s) for i, s in enumerate(seqs)] + [0] * (size - n)
        slots = [-1 if i in remote else self._slots(s.block_table, [len(s) - 1])[0]
                 for i, s in enumerate(seqs)] + [-1] * (size - n)  # fmt: skip
        return Batch(
            ids=np.asarray([s.last_token for s in seqs] + [0] * (size - n), np.int32),
            positions=np.asarray(pos, np.int32),
            slots=np.asarray(slots, np.int32),
            block_tables=bt,
            seq_lens=np.asarray(lens, np.int32),
            query_start=np.arange(size + 1, dtype=np.int32),
            last_rows=np.arange(size, dtype=np.int32),
            temperature=temp,
            top_p=top_p,
            seeds=seeds,
        )

    def _padding_batch(self, size: int) -> Batch:
        return Batch(
            ids=np.zeros(size, np.int32),
            positions=np.zeros(size, np.int32),
            slots=np.full(size, -1, np.int32),
            block_tables=np.zeros((size, self.config.max_blocks_per_seq), np.int32),
            seq_lens=np.zeros(size, np.int32),
            query_start=np.arange(size + 1, dtype=np.int32),
            last_rows=np.arange(size, dtype=np.int32),
            temperature=np.zeros(size, np.float32),
            top_p=np.ones(size, np.float32),
            seeds=np.zeros(size, np.uint64),
        )

    def _upload(self, b: Batch) -> None:
        for name in (
            "ids",
            "positions",
            "slots",
            "block_tables",
            "seq_lens",
            "query_start",
            "last_rows",
            "temperature",
            "top_p",
            "seeds",
        ):
            self.dev.upload(self.ws[name], getattr(b, name))

    def _run(
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
        self._upload(batch)
        self._gated(lambda: self._forward(batch.num_tokens, batch.num_seqs, kv, out,
                                          after_attention=after_attention))  # fmt: skip
        self.dev.synchronize()
        if self.gate is not None and self.gate.complete:
            self.settle_weights()
        return self.dev.download(out, np.int32, batch.num_seqs).tolist()

    def _linear(
        self, layer: int, out: int, x: int, w: str, m: int, n: int, k: int, accumulate: bool = False
    ) -> None:
        if self.config.weights != "host":
            self.dev.linear(out, x, self.weights[w].ptr, m, n, k, accumulate=accumulate)
            return
        dst = self.ws["proj"].ptr if accumulate else out
        self.dev.hybrid_linear(dst, x, self.weights[w].ptr, m, n, k, self.alphas[layer], HOST_TILES)
        if accumulate:
            self.dev.launch("add_inplace_kernel", out, dst, m * n)

    # ---- the forward pass ----
    def _forward(
        self,
        t: int,
        n: int,
        kv: Buffer | None,
        out: Buffer,
        num_layers: int | None = None,
        after_attention: Callable[[int], None] | None = None,
    ) -> None:
        d, s, c, w, a = self.dev, self.spec, self.config, self.weights, self.ws
        if kv is None:
            raise RuntimeError("the KV cache is not allocated yet")
        if self.rope_table is None:
            raise RuntimeError("the weights are not allocated yet")
        self._check_usable()
        dim, qkv, eps = s.hidden_size, s.qkv_size, s.rms_eps
        part, block_stride = self.layer_part, self.block_bytes // F32
        q, k, v = (
            a["qkv"].ptr,
            a["qkv"].ptr + s.q_size * F32,
            a["qkv"].ptr + (s.q_size + s.kv_size) * F32,
        )
        gate = self.gate
        if gate is not None:
            gate.embedding()
        d.launch("embed_tokens", a["x"].ptr, w["embed"].ptr, a["ids"].ptr, t, dim)
        for i in range(s.num_layers if num_layers is None else num_layers):
            if gate is not None:
                gate.layer(i)
            kc = kv.ptr + 2 * i * part  # layer i's K in block 0; blocks are block_stride apart
            vc = kc + part
            d.launch(
                "rms_norm_kernel",
                a["h"].ptr,
                a["x"].ptr,
                w[f"layers.{i}.attn_norm"].ptr,
                t,
                dim,
                eps,
            )
            self._linear(i, q, a["h"].ptr, f"layers.{i}.qkv", t, qkv, dim)
            if s.qkv_bias:
                d.launch("add_bias_kernel", q, w[f"layers.{i}.qkv_bias"].ptr, t, qkv)
            d.launch(
                "rotary_embedding",
                q,
                k,
                a["positions"].ptr,
                t,
                s.num_heads,
                s.num_kv_heads,
                s.head_dim,
                qkv,
                self.rope_table.ptr,
                s.rope.rot_dim,
                s.rope.mscale,
                int(s.rope_neox),
            )
            d.launch(
                "reshape_and_cache_kernel",
                kc,
                vc,
                k,
                v,
                a["slots"].ptr,
                t,
                s.num_kv_heads,
                s.head_dim,
                qkv,
                c.block_size,
                block_stride,
            )
            d.launch(
                "paged_attention_kernel",
                a["attn"].ptr,
                q,
                kc,
                vc,
                a["block_tables"].ptr,
                a["seq_lens"].ptr,
                a["query_start"].ptr,
                n,
                s.num_heads,
                s.num_kv_heads,
                s.head_dim,
                c.block_size,
                c.max_blocks_per_seq,
                qkv,
                s.head_dim**-0.5,
                block_stride,
            )
            if after_attention is not None:
                after_attention(i)
            self._linear(i, a["x"].ptr, a["attn"].ptr, f"layers.{i}.o", t, dim, s.q_size, True)
            d.launch(
                "rms_norm_kernel",
                a["h"].ptr,
                a["x"].ptr,
                w[f"layers.{i}.ffn_norm"].ptr,
                t,
                dim,
                eps,
            )
            gate_up = f"layers.{i}.gate_up"
            self._linear(i, a["gate_up"].ptr, a["h"].ptr, gate_up, t, 2 * s.intermediate_size, dim)
            d.launch("silu_and_mul_kernel", a["act"].ptr, a["gate_up"].ptr, t, s.intermediate_size)
            down = f"layers.{i}.down"
            self._linear(i, a["x"].ptr, a["act"].ptr, down, t, dim, s.intermediate_size, True)
        if num_layers is not None:
            return
        if gate is not None:
            gate.head()
        d.launch("gather_rows_kernel", a["last"].ptr, a["x"].ptr, a["last_rows"].ptr, n, dim)
        d.launch("rms_norm_kernel", a["last_h"].ptr, a["last"].ptr, w["norm"].ptr, n, dim, eps)
        head = "embed" if s.tie_embeddings else "lm_head"
        self._linear(s.num_layers, a["logits"].ptr, a["last_h"].ptr, head, n, s.vocab_size, dim)
        d.launch(
            "sample_tokens_kernel",
            out.ptr,
            a["logits"].ptr,
            a["temperature"].ptr,
            a["top_p"].ptr,
            a["seeds"].ptr,
            n,
            s.vocab_size,
        )
