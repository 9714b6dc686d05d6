"""The fleet gauges read at scrape time: here the circuit breaker gauge."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from backends.registry import BreakerConfig, EndpointRegistry
from gateway.fleet_gauges import CircuitGauges
from tests.unit.backends.test_registry import A1, A2, make_fleet


def test_an_open_breaker_reads_1_and_a_closed_one_0() -> None:
    registry = EndpointRegistry(make_fleet(), breaker=BreakerConfig(failures=2))
    metrics = CollectorRegistry()
    metrics.register(CircuitGauges(registry))
    for _ in range(2):
        registry.mark_failed(A1, "reset")

    def value(url: str) -> float | None:
        pool = registry.status(url).pool
        return metrics.get_sample_value("ridge_endpoint_circuit_open",
                                        {"pool": pool, "endpoint": url})
    assert value(A1) == 1.0
    assert value(A2) == 0.0
