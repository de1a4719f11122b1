"""Device profiles for the planner: per-kernel times of a decode step on a device, from a roofline
(max of bytes / bandwidth and flops / peak, plus a launch overhead), and the decode graph of a
Llama-architecture model as planner input. The pair the Tessera paper measures: H100 (SXM) and
RTX Pro 6000 (Blackwell), joined by PCIe 5.0 x16."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medusa.tessera.planner import Device, Link, Problem


@dataclass(frozen=True)
class GPU:
    name: str
    memory: float  # bytes
    bandwidth: float  # bytes / s
    flops: float  # dense bf16 flop / s
    launch: float = 4e-6

    def time(self, nbytes: float, flops: float) -> float:
        return self.launch + max(nbytes / self.bandwidth, flops / self.flops)


H100 = GPU("H100 SXM", 80e9, 3.35e12, 989e12)
RTX_PRO_6000 = GPU("RTX Pro 6000", 96e9, 1.79e12, 500e12)
PCIE5 = Link(latency=10e-6, bandwidth=64e9)


@dataclass(frozen=True)
class Llama:
    layers: int = 32
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 128256
    dtype_bytes: int = 2

    @property
    def weight_bytes(self) -> float:
        h, i, kv = self.hidden, self.intermediate, self.kv_heads * self.head_dim
        per_layer = h * (h + 2 * kv) + h * h + 3 * h * i
        return float((self.layers * per_layer + 2 * self.vocab * h) * self.dtype_bytes)

    def kv_bytes(self, tokens: int) -> float:
        return float(2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes * tokens)


LLAMA3_8B = Llama()


def decode_kernels(m: Llama, batch: int, context: int) -> list[tuple[str, float, float, float]]:
    """(name, bytes moved, flops, resident bytes) per kernel of one decode step, in order."""
    h, b, e = m.hidden, batch, m.dtype_bytes
    kv = m.kv_heads * m.head_dim
    act = b * h * e
    out: list[tuple[str, float, float, float]] = [("embed", act, 0.0, m.vocab * h * e)]
    for layer in range(m.layers):
        cache = 2 * m.kv_heads * m.head_dim * e * context * b
        for name, w in (
            ("qkv", h * (h + 2 * kv)),
            ("attn", 0),
            ("o", h * h),
            ("gate_up", 2 * h * m.intermediate),
            ("down", h * m.intermediate),
        ):
            if name == "attn":
                out.append((f"{layer}.attn", cache + 2 * act, 4.0 * b * context * h, cache))
            else:
                out.append((f"{layer}.{name}", w * e + 2 * act, 2.0 * b * w, w * e))
    out.append(("lm_head", m.vocab * h * e + act, 2.0 * b * m.vocab * h, m.vocab * h * e))
    return out


def decode_problem(
    gpus: list[GPU], link: Link, m: Llama, batch: int, context: int, utilization: float = 0.9
) -> Problem:
    ks = decode_kernels(m, batch, context)
    times = np.array([[g.time(nb, fl) for g in gpus] for _, nb, fl, _ in ks])
    act = float(batch * m.hidden * m.dtype_bytes)
    edges = [(i, i + 1, act) for i in range(len(ks) - 1)]
    # The residual stream: each layer's input reaches its attention output and its FFN output.
    for layer in range(m.layers):
        first = 1 + 5 * layer
        edges += [(first - 1, first + 2, act), (first + 2, first + 4, act)]
    devices = [Device(g.name, g.memory * utilization) for g in gpus]
    return Problem(devices, times, edges, link, memory=np.array([k[3] for k in ks]))
