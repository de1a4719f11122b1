"""How many KV blocks a start-up allocates, and how it came to that number.

One rule sizes the cache, whether the numbers were just measured or come from an artifact:

    blocks = (total * gpu_memory_utilization - held - peak) // block_bytes

`total`: the device's memory; `held`: what is in use when the cache is sized (this engine's
weights and workspace, the runtime, any other tenant of the device), i.e. total - free;
`peak`: what the profiling forward pass at the largest batch (max_num_batched_tokens over
max_num_seqs sequences) holds at its end beyond what was held before it, its throwaway KV cache
excluded: lazily loaded modules, library workspaces (on simcuda, where every activation lives in
the preallocated workspace, 0). A profiling start measures `peak`; `medusa materialize` records
it, and a restore applies the rule to the free memory of the device it lands on, with no forward
pass."""

from __future__ import annotations

from dataclasses import dataclass, field

from medusa.engine.config import EngineConfig
from medusa.errors import RefusedError

MiB = 1 << 20
# How a start-up's block count came about (its log, /metrics, the start-up report).
SOURCES = {
    "profiled": "profiled (a forward pass at the largest batch)",
    "derived": "derived from the artifact's profiling peak and this device's free memory",
    "restored": "the artifact's, as recorded",
    "configured": "from kv_cache_memory",
}


class KVCacheTooSmall(RefusedError, MemoryError):
    """Not even one sequence at max_model_len fits: the message names the sizes and the fixes."""


@dataclass(frozen=True)
class KVSize:
    num_blocks: int
    block_bytes: int
    source: str  # a key of SOURCES
    # what the count was computed from (bytes): total, free, held, peak, budget
    inputs: dict[str, int] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def profile_record(self) -> dict[str, int]:
        """What a profiled size was measured from, as the artifact's `kv` section records it:
        held_bytes (in use when profiling began) and profile_peak_bytes (the pass's peak), which
        a restore sizes from; non_kv_bytes (their sum), kv_budget, total and free_at_peak."""
        i = self.inputs
        return {
            "total": i["total"],
            "free_at_peak": i["free_at_peak"],
            "held_bytes": i["held"],
            "profile_peak_bytes": i["peak"],
            "non_kv_bytes": i["held"] + i["peak"],
            "kv_budget": i["budget"],
        }

    def describe(self) -> str:
        """One line for the start-up log: the count, its size, and how it came about."""
        line = (
            f"KV cache {self.num_blocks} blocks x {self.block_bytes} bytes = "
            f"{self.nbytes / MiB:.0f} MiB, {SOURCES[self.source]}"
        )
        i = self.inputs
        if {"free", "total", "peak"} <= i.keys():
            line += (
                f" ({mib(i['free'])} free of {mib(i['total'])}, forward-pass peak {mib(i['peak'])})"
            )
        return line


def blocks_that_fit(
    config: EngineConfig, block_bytes: int, *, free: int, total: int, peak: int
) -> tuple[int, dict[str, int]]:
    """The block count of the rule above, and what it was computed from; KVCacheTooSmall unless
    one sequence at max_model_len fits."""
    held = total - free
    budget = int(total * config.gpu_memory_utilization) - held - peak
    num = max(budget, 0) // block_bytes
    inputs = {"total": total, "free": free, "held": held, "peak": peak, "budget": budget}
    if num < config.max_blocks_per_seq:
        raise KVCacheTooSmall(_too_small(config, block_bytes, inputs, num))
    return int(num), inputs


def _too_small(config: EngineConfig, block_bytes: int, i: dict[str, int], num: int) -> str:
    need = config.max_blocks_per_seq * block_bytes
    room = max(int(i["total"] * config.gpu_memory_utilization) - i["held"], 0)
    return (
        f"the KV cache fits {num} blocks of {config.block_size} tokens, fewer than one sequence "
        f"of max_model_len={config.max_model_len} needs ({config.max_blocks_per_seq} blocks, "
        f"{mib(need)}): the device has {mib(i['free'])} free of {mib(i['total'])}, "
        f"gpu_memory_utilization={config.gpu_memory_utilization} leaves {mib(room)} of it, and "
        f"{mib(need + i['peak'])} are needed (that sequence's KV cache and the forward pass's "
        f"peak, {mib(i['peak'])}): raise --gpu-memory-utilization, lower --max-model-len (an "
        "artifact: materialize again with it), or use a device with more free memory"
    )


def mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= 10 * MiB or n == 0 else f"{n / MiB:.2f} MiB"
