"""The fleet gauges read at scrape time: the registry's own (circuit breaker, levers) and the
router state's in-flight counts."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from backends.registry.breaker import BreakerConfig
from backends.registry.endpoints import EndpointRegistry
from backends.registry.status import PollResult
from gateway.telemetry.fleet_gauges import CapacityGauges, CircuitGauges, FleetGauges
from routing.state.memory import MemoryState
from routing.state.protocol import Ask, Outcome
from tests.unit.backends.registry.fakes import (
    A1,
    A2,
    B1,
    SPEC_OFF,
    SPEC_ON,
    lever_fleet,
    make_fleet,
)


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


def test_lever_mismatches_read_1_agreements_0_and_unchecked_levers_nothing() -> None:
    registry = EndpointRegistry(lever_fleet())
    metrics = CollectorRegistry()
    metrics.register(CircuitGauges(registry))
    for url, facts in ((A1, SPEC_OFF), (A2, SPEC_ON)):
        registry.record_poll(url, PollResult(registry.now(), healthy=True))
        registry.record_facts(url, facts, registry.now())

    def value(url: str, lever: str) -> float | None:
        return metrics.get_sample_value("ridge_lever_mismatch",
                                        {"pool": "a", "endpoint": url, "lever": lever})
    assert value(A1, "speculative") == 1.0
    assert value(A1, "prefix_cache") == 0.0 and value(A1, "chunked_prefill") == 0.0
    assert value(A2, "speculative") == 0.0 and value(A2, "draft_tokens") == 0.0
    assert value(A1, "draft_tokens") is None  # not reported with speculation off: unchecked
    assert value(A1, "max_context") is None  # not declared: unchecked
    families = {f.name: f for f in metrics.collect()}
    assert not [s for s in families["ridge_lever_mismatch"].samples
                if s.labels["endpoint"] == B1]  # never healthy: never checked


async def test_in_flight_counts_a_reservation_from_placing_to_finishing() -> None:
    registry = EndpointRegistry(make_fleet())
    state = MemoryState()
    metrics = CollectorRegistry()
    metrics.register(FleetGauges(registry.snapshot, frozenset({"m"}), state))

    def in_flight() -> tuple[float | None, float | None]:
        pool = registry.status(A1).pool
        return (metrics.get_sample_value("ridge_requests_in_flight", {"pool": pool}),
                metrics.get_sample_value("ridge_endpoint_requests_in_flight",
                                         {"pool": pool, "endpoint": A1}))

    placed = await state.place(Ask("m", (), None, [A1], 10), lambda view: Only(A1))
    assert placed is not None and in_flight() == (1.0, 1.0)  # nothing sent yet
    await state.finish(placed.reservations[0], Outcome("m", (), 10, 0, None, None, False))
    assert in_flight() == (0.0, 0.0)


@dataclass(frozen=True)
class Only:
    url: str

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url,)


def test_capacities_read_as_one_gauge_per_endpoint_known() -> None:
    metrics = CollectorRegistry()
    metrics.register(CapacityGauges(lambda: [("p", A1, 6)]))
    assert metrics.get_sample_value("ridge_endpoint_capacity_requests",
                                    {"pool": "p", "endpoint": A1}) == 6.0
    assert metrics.get_sample_value("ridge_endpoint_capacity_requests",
                                    {"pool": "p", "endpoint": A2}) is None
