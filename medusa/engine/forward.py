"""The model runner's forward pass: embedding, the decoder layers (RMSNorm, QKV, RoPE, the paged
KV cache, attention, the MLP) and the sampled token, as kernel launches on the device's stream;
under serve-while-loading each part first waits for its own weights (medusa.engine.layer_gate)."""

from __future__ import annotations

from collections.abc import Callable

from medusa.engine.config import EngineConfig
from medusa.engine.device import Buffer, Device
from medusa.engine.hybrid_gemm import HOST_TILES
from medusa.engine.layer_gate import LayerGate
from medusa.engine.runner_weights import F32
from medusa.engine.spec import ModelSpec


class Forward:
    """ModelRunner's forward pass; ModelRunner.__init__ and its stages set what is declared."""

    config: EngineConfig
    spec: ModelSpec
    dev: Device
    weights: dict[str, Buffer]
    ws: dict[str, Buffer]
    rope_table: Buffer | None
    alphas: list[float]
    gate: LayerGate | None
    _check_usable: Callable[[], None]  # RunnerWeights'

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
        if self.config.weights != "host":
            self.dev.linear(out, x, self.weights[w].ptr, m, n, k, accumulate=accumulate)
            return
        dst = self.ws["proj"].ptr if accumulate else out
        self.dev.hybrid_linear(dst, x, self.weights[w].ptr, m, n, k, self.alphas[layer], HOST_TILES)
        if accumulate:
            self.dev.launch("add_inplace_kernel", out, dst, m * n)

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
