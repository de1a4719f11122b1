"""The model runner's forward pass: embedding, the decoder layers (RMSNorm, QKV, RoPE, the paged
KV cache, attention, the MLP) and the sampled token, as kernel launches on the device's stream;
under serve-while-loading each part first waits for its own weights (medusa.engine.layer_gate)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.hybrid_gemm import HOST_TILES
from medusa.engine.runner_weights import F32, RunnerWeights
from medusa.engine.spec import ModelSpec

if TYPE_CHECKING:
    from medusa.engine.tensor_parallel import TPGroup


class Forward:
    """The model runner's forward pass (ModelRunner.forward), over its weights and its workspace
    buffers (filled by ModelRunner.allocate_workspace); `dev` changes with the runner's."""

    def __init__(
        self,
        config: EngineConfig,
        spec: ModelSpec,
        weights: RunnerWeights,
        ws: dict[str, Buffer],
        device: Device,
    ) -> None:
        self.config, self.spec, self.weights, self.ws, self.dev = config, spec, weights, ws, device
        self.tp: TPGroup | None = None  # tensor parallelism: this rank's shard and communicator

    @property
    def block_bytes(self) -> int:
        """One block of every layer's K and V: the cache is [block][layer][k|v][slot][head][dim]."""
        return 2 * self.spec.num_layers * self.layer_part

    @property
    def layer_part(self) -> int:
        """One layer's K (or V) rows of one block."""
        return self.config.block_size * self.spec.kv_size * F32

    def _linear(
        self, layer: int, out: int, x: int, w: str, m: int, n: int, k: int, accumulate: bool = False
    ) -> None:
        ptr = self.weights.buffers[w].ptr
        if self.config.weights != "host":
            self.dev.linear(out, x, ptr, m, n, k, accumulate=accumulate)
            return
        dst = self.ws["proj"].ptr if accumulate else out
        self.dev.hybrid_linear(dst, x, ptr, m, n, k, self.weights.alphas[layer], HOST_TILES)
        if accumulate:
            self.dev.launch("add_inplace_kernel", out, dst, m * n)

    def run(
        self,
        t: int,
        n: int,
        kv: Buffer | None,
        out: Buffer,
        num_layers: int | None = None,
        after_attention: Callable[[int], None] | None = None,
    ) -> None:
        """`t` tokens of `n` sequences (the workspace holds their batch) through the model, the
        sampled tokens into `out`; only the first `num_layers` layers if given (no head).
        after_attention(layer): the host's work after each layer's attention (Weaver)."""
        if kv is None:
            raise RuntimeError("the KV cache is not allocated yet")
        if self.weights.rope_table is None:
            raise RuntimeError("the weights are not allocated yet")
        self.weights.check_usable()
        gate, a = self.weights.gate, self.ws
        if gate is not None:
            gate.embedding()
        w = self.weights.buffers
        dim = self.spec.hidden_size
        self.dev.launch("embed_tokens", a["x"].ptr, w["embed"].ptr, a["ids"].ptr, t, dim)
        for i in range(self.spec.num_layers if num_layers is None else num_layers):
            if gate is not None:
                gate.layer(i)
            self._attention(i, t, n, kv)
            if after_attention is not None:
                after_attention(i)
            self._mlp(i, t)
        if num_layers is not None:
            return
        if gate is not None:
            gate.head()
        self._head(n, out)

    def _qkv(self) -> tuple[int, int, int]:
        """Where q, k and v start in the workspace's qkv rows."""
        s, base = self.spec, self.ws["qkv"].ptr
        return base, base + s.q_size * F32, base + (s.q_size + s.kv_size) * F32

    def _attention(self, i: int, t: int, n: int, kv: Buffer) -> None:
        """Layer i up to its attention's output (in the workspace's attn), its K and V cached."""
        d, s, c, w, a = self.dev, self.spec, self.config, self.weights.buffers, self.ws
        q, k, v = self._qkv()
        dim, qkv = s.hidden_size, s.qkv_size
        part, block_stride = self.layer_part, self.block_bytes // F32
        kc = kv.ptr + 2 * i * part  # layer i's K in block 0; blocks are block_stride apart
        vc = kc + part
        attn_norm = w[f"layers.{i}.attn_norm"].ptr
        d.launch("rms_norm_kernel", a["h"].ptr, a["x"].ptr, attn_norm, t, dim, s.rms_eps)
        self._linear(i, q, a["h"].ptr, f"layers.{i}.qkv", t, qkv, dim)
        if s.qkv_bias:
            d.launch("add_bias_kernel", q, w[f"layers.{i}.qkv_bias"].ptr, t, qkv)
        rope = self.weights.rope_table
        assert rope is not None  # NOTE: run() checked
        d.launch("rotary_embedding", q, k, a["positions"].ptr, t, s.num_heads, s.num_kv_heads,
                 s.head_dim, qkv, rope.ptr, s.rope.rot_dim, s.rope.mscale,
                 int(s.rope_neox))  # fmt: skip
        d.launch("reshape_and_cache_kernel", kc, vc, k, v, a["slots"].ptr, t, s.num_kv_heads,
                 s.head_dim, qkv, c.block_size, block_stride)  # fmt: skip
        d.launch("paged_attention_kernel", a["attn"].ptr, q, kc, vc, a["block_tables"].ptr,
                 a["seq_lens"].ptr, a["query_start"].ptr, n, s.num_heads, s.num_kv_heads,
                 s.head_dim, c.block_size, c.max_blocks_per_seq, qkv, s.head_dim**-0.5,
                 block_stride)  # fmt: skip

    def _mlp(self, i: int, t: int) -> None:
        """Layer i from its attention's output: the o projection, the MLP, the residual adds."""
        d, s, a = self.dev, self.spec, self.ws
        dim, inter = s.hidden_size, s.intermediate_size
        self._residual(i, a["attn"].ptr, "o", t, s.q_size)
        ffn_norm = self.weights.buffers[f"layers.{i}.ffn_norm"].ptr
        d.launch("rms_norm_kernel", a["h"].ptr, a["x"].ptr, ffn_norm, t, dim, s.rms_eps)
        self._linear(i, a["gate_up"].ptr, a["h"].ptr, f"layers.{i}.gate_up", t, 2 * inter, dim)
        d.launch("silu_and_mul_kernel", a["act"].ptr, a["gate_up"].ptr, t, inter)
        self._residual(i, a["act"].ptr, "down", t, inter)

    def _residual(self, i: int, src: int, w: str, t: int, k: int) -> None:
        """x += src @ layer i's w^T; under tensor parallelism a row-parallel projection: each
        rank's partial product, summed over the ranks by one all-reduce, then added."""
        x, dim = self.ws["x"].ptr, self.spec.hidden_size
        if self.tp is None:
            self._linear(i, x, src, f"layers.{i}.{w}", t, dim, k, True)
            return
        proj = self.ws["proj"].ptr
        self._linear(i, proj, src, f"layers.{i}.{w}", t, dim, k)
        self.tp.all_reduce(proj, t * dim)
        self.dev.launch("add_inplace_kernel", x, proj, t * dim)

    def _head(self, n: int, out: Buffer) -> None:
        """The last rows' logits and the sampled tokens."""
        d, s, w, a = self.dev, self.spec, self.weights.buffers, self.ws
        dim = s.hidden_size
        d.launch("gather_rows_kernel", a["last"].ptr, a["x"].ptr, a["last_rows"].ptr, n, dim)
        d.launch("rms_norm_kernel", a["last_h"].ptr, a["last"].ptr, w["norm"].ptr, n, dim,
                 s.rms_eps)  # fmt: skip
        if self.tp is not None and self.tp.shard.vocab_parallel:
            self._sharded_logits(n)
        else:  # NOTE: a tensor-parallel rank holds the (replicated) head as lm_head
            head = "embed" if s.tie_embeddings and self.tp is None else "lm_head"
            self._linear(s.num_layers, a["logits"].ptr, a["last_h"].ptr, head, n, s.vocab_size,
                         dim)  # fmt: skip
        d.launch("sample_tokens_kernel", out.ptr, a["logits"].ptr, a["temperature"].ptr,
                 a["top_p"].ptr, a["seeds"].ptr, n, s.vocab_size)  # fmt: skip

    def _sharded_logits(self, n: int) -> None:
        """The logits under tensor parallelism: this rank's vocabulary range, every rank's joined
        by an all-gather (rank-major), then reordered into [n, vocab] (ws unshard, uploaded with
        the batch: medusa.engine.tensor_parallel.unshard_rows)."""
        assert self.tp is not None
        a, v, size = self.ws, len(self.tp.shard.vocab), self.tp.size
        self._linear(self.spec.num_layers, a["logits_part"].ptr, a["last_h"].ptr, "lm_head", n, v,
                     self.spec.hidden_size)  # fmt: skip
        self.tp.all_gather(a["logits_part"].ptr, a["logits_all"].ptr, n * v)
        self.dev.launch("gather_rows_kernel", a["logits"].ptr, a["logits_all"].ptr,
                        a["unshard"].ptr, n * size, v)  # fmt: skip


def workspace_sizes(
    config: EngineConfig, spec: ModelSpec, tp: TPGroup | None = None
) -> dict[str, int]:
    """The workspace buffers (bytes, by name) of the largest step: its batch's arrays
    (medusa.engine.batches) and the forward pass's activations; under tensor parallelism also
    the logits' shards (Forward._sharded_logits)."""
    c, s = config, spec
    t, n = c.max_num_batched_tokens, c.max_num_seqs
    sharded = {}
    if tp is not None and tp.shard.vocab_parallel:
        v = len(tp.shard.vocab)
        sharded = {"logits_part": n * v * F32, "logits_all": tp.size * n * v * F32,
                   "unshard": tp.size * n * 4}  # fmt: skip
    return {
        **sharded,
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
