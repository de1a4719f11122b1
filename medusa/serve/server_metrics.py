"""The worker's Prometheus metrics (GET /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "medusa_requests", "requests answered", ["route", "status"], registry=r
        )
        self.ttft = Histogram(
            "medusa_ttft_seconds",
            "time to first token",
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.tpot = Histogram(
            "medusa_tpot_seconds",
            "time per output token after the first",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
        )
        # graph: a prefill graph replayed; eager: launched kernel by kernel (no graphs, no bucket
        # within twice the step's tokens, or the weights still arriving)
        self.prefill_steps = Gauge(
            "medusa_prefill_steps", "prefill steps run, by how they ran", ["ran"], registry=r
        )
        self.queue = Gauge("medusa_queue_length", "requests waiting or running", registry=r)
        self.startup = Gauge(
            "medusa_startup_seconds", "engine start-up seconds by stage", ["stage"], registry=r
        )
        # source: profiled, derived (a restore, from the artifact's profiling peak and the free
        # memory), restored (the artifact's count: elastic) or configured (kv_cache_memory)
        self.kv_blocks = Gauge(
            "medusa_kv_cache_blocks", "KV-cache blocks, by how the count came about", ["source"],
            registry=r,
        )  # fmt: skip
        self.kv_bytes = Gauge(
            "medusa_kv_cache_bytes", "KV-cache bytes, by how the size came about", ["source"],
            registry=r,
        )  # fmt: skip
