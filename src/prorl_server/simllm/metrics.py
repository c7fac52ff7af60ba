"""`GET /metrics` of the simulator: the dev engine's collector (vLLM's names) plus `vllm:num_preemptions`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from prorl_server.devllm import ENGINE_INDEX, LABELS, engine_registry

if TYPE_CHECKING:
    from prorl_server.simllm.engine import SimEngine


class PreemptionCollector(Collector):
    """Reads the engine's preemption count at each scrape."""

    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        family = CounterMetricFamily("vllm:num_preemptions", "Cumulative number of preemptions.", labels=LABELS)
        family.add_metric([engine.model_name, ENGINE_INDEX], engine.preemptions, created=engine.stats.created)
        yield family


def sim_registry(engine: SimEngine) -> CollectorRegistry:
    """A registry of its own: running and waiting requests, token, prefix-cache, request and preemption counts."""
    registry = engine_registry(engine)  # type: ignore[arg-type]  # reads the same attributes as of a DevEngine
    registry.register(PreemptionCollector(engine))
    return registry
