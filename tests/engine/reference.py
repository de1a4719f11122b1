"""An independent numpy forward pass of a Llama-style model, with a plain (unpaged) KV cache:
what the engine's kernels are checked against."""

from __future__ import annotations

import numpy as np

from medusa.engine.spec import ModelSpec


class Reference:
    def __init__(self, spec: ModelSpec, weights: dict[str, np.ndarray]) -> None:
        self.s, self.w = spec, weights
        self.k: list[list[np.ndarray]] = [[] for _ in range(spec.num_layers)]
        self.v: list[list[np.ndarray]] = [[] for _ in range(spec.num_layers)]

    def _norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        x64 = x.astype(np.float64)
        r = 1.0 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + self.s.rms_eps)
        return (x * r.astype(np.float32)) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Rotates the first rot_dim dims of each head; the rest pass through."""
        rope = self.s.rope
        r = rope.rot_dim
        ang = pos[:, None].astype(np.float64) * rope.inv_freq().astype(np.float64)[None, :]
        cos = (np.cos(ang) * rope.mscale)[:, None, :]
        sin = (np.sin(ang) * rope.mscale)[:, None, :]
        out = x.copy()
        if self.s.rope_neox:
            a, b = x[..., : r // 2], x[..., r // 2 : r]
            out[..., : r // 2], out[..., r // 2 : r] = a * cos - b * sin, a * sin + b * cos
        else:
            a, b = x[..., 0:r:2], x[..., 1:r:2]
            out[..., 0:r:2], out[..., 1:r:2] = a * cos - b * sin, a * sin + b * cos
        return out

    def forward(self, ids: list[int]) -> np.ndarray:
        """Appends ids to the cached sequence; returns the logits at each new position."""
        s, w = self.s, self.w
        start = len(self.k[0]) and sum(len(k) for k in self.k[0])
        t = len(ids)
        pos = np.arange(start, start + t)
        x = w["embed"][np.asarray(ids)]
        group = s.num_heads // s.num_kv_heads
        for i in range(s.num_layers):
            h = self._norm(x, w[f"layers.{i}.attn_norm"])
            qkv = h @ w[f"layers.{i}.qkv"].T
            if s.qkv_bias:
                qkv = qkv + w[f"layers.{i}.qkv_bias"]
            q = qkv[:, : s.q_size].reshape(t, s.num_heads, s.head_dim)
            k = qkv[:, s.q_size : s.q_size + s.kv_size].reshape(t, s.num_kv_heads, s.head_dim)
            v = qkv[:, s.q_size + s.kv_size :].reshape(t, s.num_kv_heads, s.head_dim)
            q, k = self._rope(q, pos), self._rope(k, pos)
            self.k[i].append(k)
            self.v[i].append(v)
            keys, vals = np.concatenate(self.k[i]), np.concatenate(self.v[i])  # [L, kvh, d]
            keys, vals = np.repeat(keys, group, axis=1), np.repeat(vals, group, axis=1)
            scores = np.einsum("thd,lhd->htl", q, keys) / np.sqrt(s.head_dim)
            mask = np.arange(len(keys))[None, :] > pos[:, None]
            scores = np.where(mask[None], -np.inf, scores)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            attn = np.einsum("htl,lhd->thd", p, vals).reshape(t, s.q_size)
            x = x + attn @ w[f"layers.{i}.o"].T
            h = self._norm(x, w[f"layers.{i}.ffn_norm"])
            gu = h @ w[f"layers.{i}.gate_up"].T
            g, u = gu[:, : s.intermediate_size], gu[:, s.intermediate_size :]
            x = x + (g / (1 + np.exp(-g)) * u) @ w[f"layers.{i}.down"].T
        head = w["embed"] if s.tie_embeddings else w["lm_head"]
        return self._norm(x, w["norm"]) @ head.T

    def greedy(self, prompt: list[int], max_tokens: int, eos: set[int]) -> list[int]:
        out: list[int] = []
        logits = self.forward(prompt)[-1]
        while len(out) < max_tokens:
            tok = int(np.argmax(logits))
            out.append(tok)
            if tok in eos:
                break
            logits = self.forward([tok])[-1]
        return out
