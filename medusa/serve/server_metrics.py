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
        self.queue = Gauge("medusa_queue_length", "requests waiting or running", registry=r)
        self.startup = Gauge(
            "medusa_startup_seconds", "engine start-up seconds by stage", ["stage"], registry=r
        )
