"""Tensor parallelism in the reference engine (Megatron-style): each rank process holds a shard
of every layer and joins the others through NCCL's API (medusa.cuda.nccl: the real NCCL on a
GPU, libmedusa_nccl on simcuda).

- Attention is split by heads. With at least as many KV heads as ranks, the KV heads are split
  into contiguous ranges (sizes differing by at most one) and each rank computes the query heads
  of its KV heads; the KV cache is split the same way. With fewer KV heads than ranks, the query
  heads are split and each rank keeps a copy of the KV heads its query heads read (one copy per
  query head where the grouping would not be uniform), as vLLM replicates KV heads.
- QKV and gate/up are column-parallel (each rank computes its rows of the output), O and down
  row-parallel (each rank's partial product, then one all-reduce, then the residual add).
- The vocabulary is split into equal ranges where it divides by the rank count: each rank
  computes its logits, an all-gather joins them, and every rank samples the same token from the
  same logits and seeds. Otherwise every rank computes all the logits (the head is replicated).
  The embedding is replicated either way.

The ranks run the same steps in the same order (every rank is given the same requests): the
collectives meet because the schedule is deterministic.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from medusa import env
from medusa.engine.config import EngineConfig
from medusa.engine.device import Device
from medusa.engine.spec import ModelSpec
from medusa.errors import RefusedError


class TensorParallelError(RefusedError, ValueError):
    """A model or setting that cannot be split over the asked number of ranks."""


@dataclass(frozen=True)
class TPRank:
    """This process's place in a tensor-parallel group: `rank` of `size`, and the id every rank
    joins the communicator with (NCCL's unique id, made once and sent to every rank)."""

    rank: int
    size: int
    uid: bytes


def _ranges(n: int, parts: int) -> list[range]:
    """n items in `parts` contiguous ranges whose sizes differ by at most one."""
    return [range(n * r // parts, n * (r + 1) // parts) for r in range(parts)]


@dataclass(frozen=True)
class Shard:
    """What one rank holds of the model: global query heads, the KV heads it keeps (in order;
    a head may repeat), and its ranges of the MLP's intermediate dimension and the vocabulary
    (all of it when the vocabulary does not split evenly: `vocab_parallel` false)."""

    rank: int
    size: int
    q_heads: tuple[int, ...]
    kv_heads: tuple[int, ...]
    inter: range
    vocab: range

    vocab_parallel: bool  # each rank computes its own range of the logits

    def spec(self, full: ModelSpec) -> ModelSpec:
        """The rank's model: its heads and intermediate size (the vocabulary stays whole: the
        embedding is replicated; the head's shard has its own buffer, weight_shapes)."""
        return dataclasses.replace(full, num_heads=len(self.q_heads),
                                   num_kv_heads=len(self.kv_heads),
                                   intermediate_size=len(self.inter))  # fmt: skip

    def weight_shapes(self, rank_spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        """The rank's weights: the rank spec's, and its share of the head as lm_head."""
        shapes = rank_spec.weight_shapes()
        shapes["lm_head"] = (len(self.vocab), rank_spec.hidden_size)
        return shapes


def plan_shard(spec: ModelSpec, rank: int, size: int) -> Shard:
    """Rank `rank`'s shard of `spec` split over `size` ranks; TensorParallelError if it cannot
    be split (more ranks than query heads or than the MLP's intermediate size)."""
    h, kv, f, v = spec.num_heads, spec.num_kv_heads, spec.intermediate_size, spec.vocab_size
    if not 0 <= rank < size:
        raise TensorParallelError(f"rank {rank} of a tensor-parallel group of {size}")
    if size > h or size > f:
        raise TensorParallelError(
            f"{spec.name} has {h} attention heads and an MLP of {f}: it cannot be split over "
            f"{size} ranks; use a tensor-parallel size of at most {min(h, f)}"
        )
    group = h // kv
    if size <= kv:
        mine = _ranges(kv, size)[rank]
        kv_heads = tuple(mine)
        q_heads = tuple(q for k in mine for q in range(k * group, (k + 1) * group))
    else:
        q_heads = tuple(_ranges(h, size)[rank])
        used = [q // group for q in q_heads]
        counts = {k: used.count(k) for k in dict.fromkeys(used)}
        if len(set(counts.values())) == 1:
            kv_heads = tuple(counts)  # a uniform grouping: one copy of each
        else:
            kv_heads = tuple(used)  # one copy per query head
    split = v % size == 0 and size > 1
    vocab = range(rank * v // size, (rank + 1) * v // size) if split else range(v)
    return Shard(rank, size, q_heads, kv_heads, _ranges(f, size)[rank], vocab, split)


def _head_rows(heads: Iterable[int], head_dim: int) -> np.ndarray:
    return np.concatenate([np.arange(k * head_dim, (k + 1) * head_dim) for k in heads])


def shard_weights(
    weights: Iterable[tuple[str, np.ndarray]], spec: ModelSpec, shard: Shard
) -> Iterator[tuple[str, np.ndarray]]:
    """The full model's weights (name, array), cut to the rank's shard; the head's share comes
    from lm_head, or from the embedding when they are tied."""
    hd, q_size, kv_size = spec.head_dim, spec.q_size, spec.kv_size
    q_rows = _head_rows(shard.q_heads, hd)
    kv_rows = _head_rows(shard.kv_heads, hd)
    qkv_rows = np.concatenate([q_rows, q_size + kv_rows, q_size + kv_size + kv_rows])
    f, inter = spec.intermediate_size, np.arange(shard.inter.start, shard.inter.stop)
    vocab = slice(shard.vocab.start, shard.vocab.stop)
    for name, arr in weights:
        part = name.rsplit(".", 1)[-1]
        if part in ("qkv", "qkv_bias"):
            yield name, np.ascontiguousarray(arr.reshape(spec.qkv_size, -1)[qkv_rows])
        elif part == "o":
            yield name, np.ascontiguousarray(arr.reshape(spec.hidden_size, q_size)[:, q_rows])
        elif part == "gate_up":
            rows = np.concatenate([inter, f + inter])
            yield name, np.ascontiguousarray(arr.reshape(2 * f, -1)[rows])
        elif part == "down":
            yield name, np.ascontiguousarray(arr.reshape(spec.hidden_size, f)[:, inter])
        elif name == "lm_head":
            yield name, np.ascontiguousarray(arr.reshape(spec.vocab_size, -1)[vocab])
        else:
            yield name, arr
            if name == "embed" and spec.tie_embeddings:
                yield "lm_head", np.ascontiguousarray(arr.reshape(spec.vocab_size, -1)[vocab])


def unshard_rows(n: int, size: int) -> np.ndarray:
    """Row indices that turn an all-gather of `size` ranks' [n, vocab/size] logits (rank-major)
    into [n, vocab]: output row j * size + r is rank r's row j."""
    j, r = np.meshgrid(np.arange(n), np.arange(size), indexing="ij")
    return (r * n + j).astype(np.int32).ravel()


def share_cores(ranks: int) -> None:
    """On simcuda the ranks share the machine's cores: each rank's CPU BLAS (behind mblas) and
    simcuda's kernel threads get its share, unless MEDUSA_BLAS_THREADS / MEDUSA_SIM_THREADS say
    otherwise. Read at the first GEMM, which comes
    after the communicator (a group's pools of a thread per core each starved the rank a
    collective waited on: a decode step 7x slower at 2 ranks on 2 cores)."""
    share = max(1, (os.cpu_count() or 1) // ranks)
    os.environ.setdefault(env.BLAS_THREADS.name, str(share))
    os.environ.setdefault(env.SIM_THREADS.name, str(share))  # simcuda's kernel threads, likewise


class TPGroup:
    """A rank's communicator and shard, on its device's stream (ModelRunner.tp)."""

    def __init__(self, tp: TPRank, device: Device, spec: ModelSpec) -> None:
        from medusa.cuda.nccl import Nccl

        share_cores(tp.size)
        self.rank, self.size, self.dev = tp.rank, tp.size, device
        self.shard = plan_shard(spec, tp.rank, tp.size)
        self.comm = Nccl(device.b).init_rank(tp.size, tp.uid, tp.rank)
        self._scratch = device.alloc(8)
        self._unshard_rows = 0  # the row count ws["unshard"] holds the table of

    def upload_unshard(self, ws: dict[str, Any], rows: int) -> None:
        """Where each rank's logits go for a step of `rows` rows (Forward._sharded_logits): the
        table depends on the row count only, so it is written when that changes."""
        if self.shard.vocab_parallel and rows != self._unshard_rows:
            self.dev.upload(ws["unshard"], unshard_rows(rows, self.size))
            self._unshard_rows = rows

    def all_reduce(self, buf: int, count: int) -> None:
        """buf[count] float32 = the sum over the ranks, on the stream (a capture records it)."""
        self.comm.all_reduce(buf, buf, count, stream=self.dev.stream)

    def all_gather(self, send: int, recv: int, count: int) -> None:
        self.comm.all_gather(send, recv, count, stream=self.dev.stream)

    def agree_min(self, value: int) -> int:
        """The smallest of every rank's value (each rank calls it at the same point)."""
        self.dev.upload(self._scratch, np.array([value], np.int64))
        self.comm.all_reduce(self._scratch.ptr, self._scratch.ptr, 1, "int64", "min",
                             self.dev.stream)  # fmt: skip
        self.dev.synchronize()
        return int(self.dev.download(self._scratch, np.int64, 1)[0])

    def close(self) -> None:
        self.dev.free(self._scratch)
        self.comm.destroy()


def check_tensor_parallel(config: EngineConfig) -> None:
    """What a tensor-parallel start does not combine with yet, refused before any work."""
    if config.step_hooks or config.kv_memory != "static":
        # NOTE: Weaver's fallback and an elastic cache's preemption decide per rank: the ranks
        # would run different steps
        raise TensorParallelError(
            "a tensor-parallel start runs the same steps on every rank: Weaver (step hooks) and "
            "kv_memory='elastic' decide per rank and are not supported with it"
        )
    if config.weights == "host":
        raise TensorParallelError(
            "weights='host' maps one store for one device: a tensor-parallel rank holds its "
            "shard in device memory (weights='device')"
        )
