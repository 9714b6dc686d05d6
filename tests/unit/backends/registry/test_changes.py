"""Fleet changes: an endpoint that joins is unhealthy until probed, one that leaves drains (never
chosen again, its request in flight released normally, gone once idle or after the drain
timeout), and a fleet applied again adds, removes and changes pools."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from backends.registry.endpoints import EndpointRegistry
from backends.registry.status import PollResult
from config.fleet import Fleet, parse_fleet
from gateway.app import build_router
from routing.features import FeatureExtractor, RequestInfo
from routing.load import LoadCounts
from routing.router import RoutePlan
from routing.state.memory import MemoryState
from routing.state.protocol import Ask, Outcome
from tests.unit.backends.registry.fakes import (
    B1,
    FakeClock,
    FakeSource,
    StubLookup,
    dns_fleet,
    ip,
    poller_of,
    pool,
    urls_of,
)


def test_an_endpoint_that_joins_is_unhealthy_until_probed(clock: FakeClock) -> None:
    registry = EndpointRegistry(dns_fleet(), clock=clock)
    changes = registry.set_endpoints("a", [ip(1), ip(2) + "/"])
    assert changes.added == (ip(1), ip(2)) and changes.drained == ()
    assert [(e.url, e.healthy) for e in registry.snapshot()[0].endpoints] == \
        [(ip(1), False), (ip(2), False)]
    registry.record_poll(ip(1), PollResult(clock(), healthy=True))
    assert [e.healthy for e in registry.snapshot()[0].endpoints] == [True, False]
    assert registry.models_available() == ["m"]
    assert not registry.set_endpoints("a", [ip(1), ip(2)])  # the same set: no change
    assert not registry.set_endpoints("gone", [ip(1)])  # no such pool


async def test_a_vanished_endpoint_drains_not_chosen_and_its_request_released(
        lookup: StubLookup, source: FakeSource, clock: FakeClock) -> None:
    fleet = dns_fleet()
    registry = EndpointRegistry(fleet, clock=clock)
    state = MemoryState()
    poller = poller_of(registry, source, lookup, in_flight=state.in_flight)
    lookup.addresses(1, 2)
    await poller.poll_once()
    router = build_router(fleet)
    features = FeatureExtractor().extract({"prompt": "hi"}, RequestInfo("completions", "m"))

    async def place(exclude: frozenset[str] = frozenset()) -> tuple[RoutePlan, Any]:
        pools = registry.snapshot()
        urls = [e.url for p in pools if p.name == "a" for e in p.endpoints]
        placed = await state.place(Ask("m", features.block_hashes, None, urls, 10),
                                   lambda view: router.choose(features, pools[:1], view, exclude))
        assert placed is not None
        return placed.choice, placed.reservations[0]

    plan, held = await place(exclude=frozenset({ip(2)}))
    assert plan.endpoint.url == ip(1) and state.in_flight()[ip(1)].requests == 1
    lookup.addresses(2)  # ip(1) leaves with a request in flight
    await poller.poll_once()
    assert urls_of(registry, "a") == [ip(2)] and registry.draining == (ip(1),)
    for _ in range(5):  # never chosen again
        other, reservation = await place()
        assert other.endpoint.url == ip(2)
        await state.finish(reservation, Outcome("m", (), 1, 0, 1, None, True))
    registry.mark_failed(ip(1), "its request broke")  # the outcome of its request is taken
    registry.mark_succeeded(ip(1))
    assert ip(1) not in urls_of(registry, "a") and registry.status(ip(1)).pool == "a"
    assert ("health", ip(1), "vllm") not in source.calls[-4:]  # no longer probed
    await state.finish(held, Outcome("m", (), 1, 0, 1, None, True))  # released normally
    assert state.in_flight() == {}
    await poller.poll_once()
    assert not registry.draining and ip(1) not in registry.urls
    registry.mark_succeeded(ip(1))  # a late outcome has nowhere to go: ignored


def test_a_busy_endpoint_leaves_after_the_drain_timeout(
        clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    registry = EndpointRegistry(dns_fleet(), drain_timeout_s=30.0, clock=clock)
    registry.set_endpoints("a", [ip(1), ip(2)])
    registry.set_endpoints("a", [ip(2)])
    busy = {ip(1): LoadCounts(1, 10)}
    clock.t += 29.0
    assert registry.sweep(busy) == () and registry.draining == (ip(1),)
    caplog.set_level(logging.INFO)
    clock.t += 1.0
    assert registry.sweep(busy) == (ip(1),)
    assert "gone after draining 30 s, with 1 request(s) still in flight" in caplog.text
    with pytest.raises(KeyError):
        registry.status(ip(1))


def test_an_endpoint_back_while_draining_starts_afresh(clock: FakeClock) -> None:
    registry = EndpointRegistry(dns_fleet(), clock=clock)
    registry.set_endpoints("a", [ip(1)])
    registry.record_poll(ip(1), PollResult(clock(), healthy=True))
    registry.set_endpoints("a", [])
    assert registry.draining == (ip(1),)
    registry.record_poll(ip(1), PollResult(clock(), healthy=False))  # a probe from before: dropped
    changes = registry.set_endpoints("a", [ip(1)])
    assert changes.added == (ip(1),) and not registry.draining
    status = registry.status(ip(1))
    assert not status.healthy and status.last_poll_at is None


def test_a_url_another_pool_holds_is_not_taken(clock: FakeClock,
                                                caplog: pytest.LogCaptureFixture) -> None:
    registry = EndpointRegistry(dns_fleet(), clock=clock)
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        registry.set_endpoints("a", [ip(1), B1])
    assert urls_of(registry, "a") == [ip(1)] and registry.status(B1).pool == "b"
    assert caplog.text.count("pool a does not take it too") == 1


def test_listeners_hear_of_every_change_of_the_endpoint_set(clock: FakeClock) -> None:
    registry = EndpointRegistry(dns_fleet(), clock=clock)
    heard: list[tuple[str, ...]] = []
    registry.watch(lambda: heard.append(registry.urls))
    registry.set_endpoints("a", [ip(1)])
    registry.set_endpoints("a", [ip(1)])  # no change: not told
    registry.set_endpoints("a", [])
    registry.sweep()
    assert heard == [(ip(1), B1), (B1, ip(1)), (B1,)]


# -- a fleet applied again -------------------------------------------------------------------------


def fleet(*pools: dict[str, Any]) -> Fleet:
    return parse_fleet({"pools": list(pools)})


def test_applying_a_fleet_adds_removes_and_changes_pools(clock: FakeClock) -> None:
    before = fleet(pool("a", "vllm", ["m"], [ip(1), ip(2)]), pool("b", "vllm", ["m"], [B1]),
                   pool("c", "vllm", ["n"], [ip(9)]))
    registry = EndpointRegistry(before, clock=clock)
    for url in registry.urls:
        registry.record_poll(url, PollResult(clock(), healthy=True))
    after = fleet(pool("a", "vllm", ["m"], [ip(2), ip(3)]),  # ip(1) out, ip(3) in
                  pool("b", "vllm", ["m"], [B1], levers={"prefix_caching": True}),  # changed
                  pool("d", "sglang", ["n"], [ip(9)]))  # c removed; its endpoint moves to d
    changes = registry.apply_fleet(after)
    assert (changes.pools_added, changes.pools_removed, changes.pools_changed) == \
        (("d",), ("c",), ("b",))
    assert set(changes.added) == {ip(3), ip(9)} and set(changes.drained) == {ip(1), ip(9)}
    assert [p.name for p in registry.snapshot()] == ["a", "b", "d"]
    assert urls_of(registry, "a") == [ip(2), ip(3)] and urls_of(registry, "d") == [ip(9)]
    assert registry.draining == (ip(1),)
    assert registry.status(ip(9)).pool == "d" and not registry.status(ip(9)).healthy
    assert registry.dialect_of(ip(9)).engine == "sglang"
    assert registry.status(ip(2)).healthy  # kept as it was
    assert registry.snapshot()[1].levers == frozenset({"prefix_cache"})
    assert registry.facts_due(B1)  # its pool's levers changed: its engine is asked again
    assert not registry.apply_fleet(after)  # the same fleet again: nothing changes


def test_a_dns_pool_keeps_its_addresses_when_its_names_stay(clock: FakeClock) -> None:
    registry = EndpointRegistry(dns_fleet(), clock=clock)
    registry.set_endpoints("a", [ip(1), ip(2)])
    changed = dns_fleet(levers={"prefix_caching": True})
    assert registry.apply_fleet(changed).pools_changed == ("a",)
    assert urls_of(registry, "a") == [ip(1), ip(2)]
    renamed = parse_fleet({"pools": [pool("a", "vllm", ["m"], ["http://other:8000"],
                                          resolve="dns"), pool("b", "vllm", ["m"], [B1])]})
    changes = registry.apply_fleet(renamed, {"a": [ip(5)]})  # looked up by the reload
    assert changes.added == (ip(5),) and set(changes.drained) == {ip(1), ip(2)}
    assert urls_of(registry, "a") == [ip(5)]
