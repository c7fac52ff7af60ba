"""`GET /metrics`: the engine's state and totals in Prometheus text, under vLLM's metric names and labels.

Each app has its own registry (several engines can run in one process); the values are read from the
engine when scraped. Names as a vLLM 0.x `/metrics` shows them (counters get `_total`), labels
`engine="0"` and `model_name` (and `finished_reason` on `vllm:request_success`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prorl_server.devllm.engine import DevEngine

LABELS = ["model_name", "engine"]
ENGINE_INDEX = "0"


class EngineCollector(Collector):
    """Reads a `DevEngine` at each scrape."""

    def __init__(self, engine: DevEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine, stats = self._engine, self._engine.stats
        labels = [engine.model_name, ENGINE_INDEX]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=LABELS)
            family.add_metric(labels, value, created=stats.created)
            return family

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", engine.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", engine.num_waiting)
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", stats.prefix_cache_hits
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens)
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*LABELS, "finished_reason"]
        )
        for reason, count in stats.finished.items():
            success.add_metric([*labels, reason], count, created=stats.created)
        yield success


def engine_registry(engine: DevEngine) -> CollectorRegistry:
    """A registry of its own holding `engine`'s metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine))
    return registry
