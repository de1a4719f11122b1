"""A small Llama-shaped decoder in PyTorch (random weights, fixed seed) whose decode CUDA graphs,
one per batch size, Medusa materializes and restores: scripts/gpu/torch_restore.sh runs it
through check.py. What torch does that the restore must survive: cuBLAS/cuBLASLt GEMMs (hidden
kernels of lazily loaded modules), torch's caching allocator (tensors are offsets into
cudaMalloc'd segments), one graph pool shared by every capture, a cuBLAS workspace per stream.

  python decoder.py record --ref DIR                   (harness.py says what each mode does)
  python decoder.py restore --artifact ART --ref DIR

Setup makes the same allocations in the same order in every process: weights from a CPU
generator copied one by one, static inputs, KV cache and output, then a warm-up of every batch
size on the capture stream (it loads cuBLAS's kernels and makes its workspace for that stream),
then torch's cached blocks are released. Without a CUDA device it prints "skipped: ..." and
exits 0.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from typing import Any

# NOTE: expandable segments map memory with the VMM API in every phase, and restore does not
# replay VMM reservations made in a skipped phase: the graph pool must be plain segments.
os.environ.pop("PYTORCH_ALLOC_CONF", None)
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"

import harness  # noqa: E402  (beside this file)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, FFN, MAX_LEN = 4096, 512, 4, 8, 4, 1536, 64
HEAD_DIM, DTYPE, BATCHES = DIM // HEADS, torch.bfloat16, (8, 4, 2, 1)


def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(DTYPE) * w


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


class Decoder:
    """The model as plain tensors, so that the allocation order is the order written here."""

    def __init__(self, device: torch.device) -> None:
        g = torch.Generator().manual_seed(0)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(DTYPE).to(device)

        qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
        self.embed, self.lm_head = w(VOCAB, DIM), w(DIM, VOCAB)
        self.norm = torch.ones(DIM, dtype=DTYPE, device=device)
        self.layers = [
            {
                "attn_norm": w(DIM).abs(),
                "qkv": w(DIM, qkv),
                "o": w(HEADS * HEAD_DIM, DIM),
                "mlp_norm": w(DIM).abs(),
                "gate_up": w(DIM, 2 * FFN),
                "down": w(FFN, DIM),
            }
            for _ in range(LAYERS)
        ]
        inv = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
        angles = torch.outer(torch.arange(MAX_LEN, dtype=torch.float32), inv)
        self.cos, self.sin = angles.cos().to(DTYPE).to(device), angles.sin().to(DTYPE).to(device)
        shape = (LAYERS, max(BATCHES), MAX_LEN, KV_HEADS, HEAD_DIM)
        self.k_cache = torch.zeros(shape, dtype=DTYPE, device=device)
        self.v_cache = torch.zeros(shape, dtype=DTYPE, device=device)
        self.tokens = torch.zeros(max(BATCHES), dtype=torch.long, device=device)
        self.positions = torch.zeros(max(BATCHES), dtype=torch.long, device=device)
        self.slots = torch.arange(max(BATCHES), device=device)
        self.steps = torch.arange(MAX_LEN, device=device)
        self.out = torch.zeros(max(BATCHES), VOCAB, dtype=torch.float32, device=device)

    def attention(self, i: int, h: torch.Tensor, cos: Any, sin: Any, n: int) -> torch.Tensor:
        q, k, v = (h @ self.layers[i]["qkv"]).split(
            [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1
        )
        q = rope(q.view(n, HEADS, HEAD_DIM), cos, sin)
        pos = self.positions[:n]
        self.k_cache[i][self.slots[:n], pos] = rope(k.view(n, KV_HEADS, HEAD_DIM), cos, sin)
        self.v_cache[i][self.slots[:n], pos] = v.view(n, KV_HEADS, HEAD_DIM)
        group = HEADS // KV_HEADS
        q = q.view(n, KV_HEADS, group, HEAD_DIM)
        keys = self.k_cache[i][:n].permute(0, 2, 3, 1)  # (n, kv heads, head dim, len)
        scores = (q @ keys).float() * HEAD_DIM**-0.5  # (n, kv heads, group, len)
        scores.masked_fill_(self.steps > pos.view(n, 1, 1, 1), float("-inf"))
        probs = scores.softmax(-1).to(DTYPE)
        o = probs @ self.v_cache[i][:n].permute(0, 2, 1, 3)  # (n, kv heads, group, head dim)
        return o.reshape(n, HEADS * HEAD_DIM) @ self.layers[i]["o"]

    def step(self, n: int) -> None:
        """One decode step of the first n sequences; the logits land in self.out[:n]."""
        x = self.embed[self.tokens[:n]]
        cos = self.cos[self.positions[:n]].unsqueeze(1)
        sin = self.sin[self.positions[:n]].unsqueeze(1)
        for i, layer in enumerate(self.layers):
            x = x + self.attention(i, rmsnorm(x, layer["attn_norm"]), cos, sin, n)
            gate, up = (rmsnorm(x, layer["mlp_norm"]) @ layer["gate_up"]).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        self.out[:n].copy_(rmsnorm(x, self.norm) @ self.lm_head)  # bf16 -> fp32: a kernel


class TorchWorkload:
    label = "torch restore"
    batch_sizes: tuple[int, ...] = BATCHES

    def __init__(self) -> None:
        self.model: Decoder | None = None
        self.pool: Any = None

    def setup(self) -> None:
        torch.set_grad_enabled(False)
        self.side = torch.cuda.Stream()  # captures and warm-up: cuBLAS's workspace is per stream
        self.model = Decoder(torch.device("cuda"))
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            for n in self.batch_sizes:
                self.model.step(n)
        torch.cuda.current_stream().wait_stream(self.side)
        torch.cuda.synchronize()
        self.model.k_cache.zero_(), self.model.v_cache.zero_()
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # what torch.cuda.graph would release inside the capture phase

    def capture(self, batch: int) -> torch.cuda.CUDAGraph:
        assert self.model is not None
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.side):
            self.model.step(batch)
        return g

    def replay(self, graph: torch.cuda.CUDAGraph) -> None:
        graph.replay()

    def backend(self) -> Any:
        from medusa.cuda.backend import load_backend

        return load_backend("cuda")  # after setup: finds the libcudart torch loaded

    def stream(self) -> int:
        return int(torch.cuda.current_stream().cuda_stream)

    def step(self, batch: int, step: int, run: Callable[[], None]) -> bytes:
        m = self.model
        assert m is not None
        m.tokens[:batch].copy_(
            torch.tensor([(7 * b + 3 * batch + 11 * step) % VOCAB for b in range(batch)])
        )
        m.positions[:batch].copy_(
            torch.tensor([(b + batch + step) % MAX_LEN for b in range(batch)])
        )
        run()
        return m.out[:batch].cpu().numpy().tobytes()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def no_cuda() -> str | None:
    if torch.cuda.is_available():
        return None
    return f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)"


if __name__ == "__main__":
    sys.exit(harness.main(TorchWorkload, unavailable=no_cuda))
