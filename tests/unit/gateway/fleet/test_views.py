"""gateway.fleet.views: a dispatcher's registry view shows it only its fleet's pools (the
registry's own snapshot while they are the same), and the MFU/MBU accounting follows the
endpoint set — a ``resolve: dns`` pool's addresses included — rebuilt only when the facts by
URL change."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from backends.registry.endpoints import EndpointRegistry
from config.fleet import Fleet, parse_fleet
from gateway.fleet.views import FleetRegistryView, LiveEfficiency, registry_facts
from gateway.telemetry.prometheus import RequestRecord, Telemetry
from tests.fakes.harness import HARDWARE, MODEL_FACTS

NAME = "http://engine.ns.svc:8000"
IP1, IP2 = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
B1 = "http://b1:8000"


def pool(name: str, urls: list[str], facts: bool = True, **extra: Any) -> dict[str, Any]:
    raw = {"name": name, "engine": "vllm", "models": ["m"], "endpoints": urls, **extra}
    return {**raw, "model": MODEL_FACTS, "hardware": HARDWARE} if facts else raw


def fleet(*pools: dict[str, Any]) -> Fleet:
    return parse_fleet({"pools": list(pools)})


def test_a_fleet_view_shows_its_fleets_pools_and_the_registrys_tuple_when_they_agree() -> None:
    start = fleet(pool("a", [IP1]), pool("b", [B1]))
    registry = EndpointRegistry(start)
    view = FleetRegistryView(registry, start)
    assert view.snapshot() is registry.snapshot()
    assert view.snapshot() is view.snapshot()
    registry.apply_fleet(fleet(pool("a", [IP1]), pool("b", [B1]), pool("c", [IP2])))
    assert [p.name for p in view.snapshot()] == ["a", "b"]  # c is not its fleet's
    assert view.snapshot() is view.snapshot()  # filtered once per registry snapshot
    registry.mark_failed(IP1, "refused")  # outcomes go to the registry as they are
    assert registry.status(IP1).consecutive_failures == 1


def test_the_accounting_follows_a_dns_pools_addresses() -> None:
    start = fleet(pool("a", [NAME], resolve="dns"), pool("b", [B1]),
                  pool("nofacts", ["http://n:1"], facts=False))
    registry = EndpointRegistry(start)
    telemetry = Telemetry(CollectorRegistry(), frozenset({"m"}))
    telemetry.bind_fleet(start, registry.snapshot)
    live = LiveEfficiency(telemetry, registry, start)
    registry.watch(live.rebind)
    assert telemetry.ledger is not None and set(telemetry.ledger.facts) == {B1}  # no name URL
    registry.set_endpoints("a", [IP1, IP2])
    ledger = telemetry.ledger
    assert ledger is not None and set(ledger.facts) == {IP1, IP2, B1}
    assert ledger.facts[IP2].pool == "a" and set(registry_facts(registry)) == set(ledger.facts)
    telemetry.record(RequestRecord("m", "a", 200, 1.0, ttft_s=0.1, completion_tokens=10,
                                   endpoint=IP2, prompt_tokens=100))
    flops = telemetry.metrics_registry.get_sample_value(
        "ridge_estimated_flops_total", {"pool": "a", "endpoint": IP2, "source": "ridge"})
    assert flops is not None and flops > 0
    registry.set_endpoints("a", [IP2, IP1])  # the same endpoints: nothing rebuilt
    assert telemetry.ledger is ledger
    registry.set_endpoints("a", [IP2])
    registry.sweep()
    assert telemetry.ledger is not ledger and set(telemetry.ledger.facts) == {IP2, B1}
    assert telemetry.metrics_registry.get_sample_value(
        "ridge_estimated_flops_total", {"pool": "a", "endpoint": IP1, "source": "ridge"}) is None
    assert telemetry.metrics_registry.get_sample_value(
        "ridge_hardware_peak_flops_per_second", {"pool": "a"}) == HARDWARE["peak_flops"]
