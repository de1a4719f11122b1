"""The gateway's Prometheus metrics: cold starts, queue, instances, latency, outcomes."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from medusa.serve.gateway.instance import Instance


class GatewayMetrics:
    # NOTE: long because it is the one list of every metric the gateway exports.
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.cold_starts = Counter(
            "medusa_gateway_cold_starts", "workers started", ["model"], registry=r
        )
        self.cold_seconds = Histogram(
            "medusa_gateway_cold_start_seconds",
            "process start to ready",
            ["model"],
            registry=r,
            buckets=(0.5, 1, 2, 4, 8, 16, 32, 64),
        )
        self.stage_seconds = Gauge(
            "medusa_gateway_cold_start_stage_seconds",
            "the last cold start's seconds by stage",
            ["model", "stage"],
            registry=r,
        )
        self.pooled_stage_seconds = Histogram(
            "medusa_gateway_pooled_start_stage_seconds",
            "starts from the warm pool, by stage: wait (for a warming worker), assign, weights, "
            "restore, ready (taken to serving)",
            ["model", "stage"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8),
        )
        self.pool_workers = Gauge(
            "medusa_gateway_pool_workers",
            "pooled workers (no model) by slice class and state (warming, idle)",
            ["slice_class", "state"],
            registry=r,
        )
        self.host_weight_bytes = Gauge(
            "medusa_gateway_host_weight_bytes",
            "host memory of a host-weight model's weight store, mapped once and shared by its "
            "workers",
            ["model"],
            registry=r,
        )
        self.queue = Gauge(
            "medusa_gateway_queue_length", "requests waiting for an instance", ["model"], registry=r
        )
        self.instances = Gauge(
            "medusa_gateway_instances", "instances by state", ["model", "state"], registry=r
        )
        self.ttft = Histogram(
            "medusa_gateway_ttft_seconds",
            "time to first byte from the worker",
            ["model"],
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
        )
        self.tpot = Histogram(
            "medusa_gateway_tpot_seconds",
            "time between streamed chunks",
            ["model"],
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
        )
        self.prism_pages = Gauge(
            "medusa_prism_pages_held",
            "elastic slices: KV pages (2 MiB) the ledger counts for a model's workers",
            ["slice", "model"],
            registry=r,
        )
        self.prism_kvpr = Gauge(
            "medusa_prism_kvpr",
            "elastic slices: KV pressure ratio, sum(rate / slo_ttft) per GiB of shared KV memory",
            ["slice"],
            registry=r,
        )
        self.prism_ledger = Gauge(
            "medusa_prism_ledger_pages",
            "elastic slices: the page ledger's capacity and free pages",
            ["slice", "state"],
            registry=r,
        )
        self.prism_queue = Gauge(
            "medusa_prism_queue_length",
            "elastic slices: requests waiting in the slice's Moore-Hodgson queue",
            ["slice"],
            registry=r,
        )
        self.requests = Counter(
            "medusa_gateway_requests", "requests by outcome", ["model", "status"], registry=r
        )

    async def observe_cold_start(self, inst: Instance) -> None:
        """A worker that became ready: its start's seconds and stages; the engine's stages from
        the worker's own /metrics when its start did not send them."""
        self.cold_starts.labels(inst.model).inc()
        self.cold_seconds.labels(inst.model).observe(inst.ready_seconds)
        for stage, secs in inst.stages.items():
            self.pooled_stage_seconds.labels(inst.model, stage).observe(secs)
        for stage, secs in inst.timings.items():
            self.stage_seconds.labels(inst.model, stage).set(secs)
        if inst.timings:
            return
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = await inst.client.get("/metrics", timeout=5)
            for line in r.text.splitlines():
                if line.startswith('medusa_startup_seconds{stage="'):
                    stage = line.split('"')[1]
                    self.stage_seconds.labels(inst.model, stage).set(float(line.split()[-1]))
