"""EndpointRegistry and Poller when the endpoints change at runtime: a ``resolve: dns`` pool
follows its name (stub look-ups), a fleet applied again adds, removes and changes pools, and an
endpoint that leaves drains: never chosen again, its request in flight released normally, gone
once idle or after the drain timeout."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from backends.registry.endpoints import EndpointRegistry, Poller, PollResult
from backends.registry.resolver import DnsResolver
from config.fleet_file import Fleet, parse_fleet
from gateway.app import build_router
from routing.features import FeatureExtractor, RequestInfo
from routing.load import LoadCounts
from routing.router import RoutePlan
from routing.state.memory import MemoryState
from routing.state.protocol import Ask, Outcome
from tests.unit.backends.registry.test_endpoints import FakeClock, FakeSource, pool, up

NAME = "http://engine-a.ns.svc:8000"
B1 = "http://b1:8000"


def ip(n: int) -> str:
    return f"http://10.0.0.{n}:8000"


class StubLookup:
    """The look-up of every name: a list of addresses, or an exception."""

    def __init__(self) -> None:
        self.answer: Sequence[str] | Exception = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        await self.gate.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def addresses(self, *last_octets: int) -> None:
        self.answer = [f"10.0.0.{n}" for n in last_octets]


def dns_fleet(**extra: Any) -> Fleet:
    return parse_fleet({"pools": [pool("a", "vllm", ["m"], [NAME], resolve="dns", **extra),
                                  pool("b", "vllm", ["m"], [B1])]})


def urls_of(registry: EndpointRegistry, pool_name: str) -> list[str]:
    return [e.url for p in registry.snapshot() if p.name == pool_name for e in p.endpoints]


@pytest.fixture
def lookup() -> StubLookup:
    return StubLookup()


@pytest.fixture
def source() -> FakeSource:
    fake = FakeSource()
    for url in [*(ip(n) for n in range(1, 10)), B1]:
        up(fake, url)
    return fake


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def poller_of(registry: EndpointRegistry, source: FakeSource, lookup: StubLookup,
              in_flight: Any = None) -> Poller:
    return Poller(registry, source, resolver=DnsResolver(lookup), in_flight=in_flight)


async def test_a_dns_pool_grows_and_shrinks_with_its_name_without_a_restart(
        lookup: StubLookup, source: FakeSource, clock: FakeClock) -> None:
    registry = EndpointRegistry(dns_fleet(), clock=clock)
    assert urls_of(registry, "a") == []  # unknown until its first look-up
    poller = poller_of(registry, source, lookup)
    lookup.addresses(2, 1)
    await poller.poll_once()
    assert urls_of(registry, "a") == [ip(1), ip(2)]
    assert all(e.healthy for p in registry.snapshot() for e in p.endpoints)
    lookup.addresses(1, 2, 3)  # scaled up
    await poller.poll_once()
    assert urls_of(registry, "a") == [ip(1), ip(2), ip(3)]
    assert registry.status(ip(3)).healthy  # probed in the round that found it
    lookup.addresses(3)  # scaled down: nothing in flight, so they go in the same round
    await poller.poll_once()
    assert urls_of(registry, "a") == [ip(3)]
    assert registry.urls == (ip(3), B1) and registry.draining == ()
    assert ("health", ip(1), "vllm") in source.calls


async def test_the_state_is_told_of_each_endpoint_that_is_gone(
        lookup: StubLookup, source: FakeSource, clock: FakeClock) -> None:
    registry, gone = EndpointRegistry(dns_fleet(), clock=clock), []
    poller = Poller(registry, source, resolver=DnsResolver(lookup), on_gone=gone.append)
    lookup.addresses(1, 2)
    await poller.poll_once()
    lookup.addresses(2)
    await poller.poll_once()
    assert gone == [ip(1)]  # its prefixes are forgotten: a new pod may take the address


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


async def test_a_failed_look_up_keeps_the_last_set(
        lookup: StubLookup, source: FakeSource, clock: FakeClock,
        caplog: pytest.LogCaptureFixture) -> None:
    registry = EndpointRegistry(dns_fleet(), clock=clock)
    poller = poller_of(registry, source, lookup)
    lookup.addresses(1, 2)
    await poller.poll_once()
    caplog.set_level(logging.WARNING)
    lookup.answer = OSError("Temporary failure in name resolution")
    for _ in range(3):
        await poller.poll_once()
    assert urls_of(registry, "a") == [ip(1), ip(2)]
    assert registry.draining == ()
    failures = [r for r in caplog.records if "cannot resolve" in r.getMessage()]
    assert len(failures) == 1  # once, not once per poll


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


# -- a fleet applied again ----------------------------------------------------------------------


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


async def test_a_look_up_under_way_does_not_set_a_pool_a_reload_replaced(
        lookup: StubLookup, source: FakeSource, clock: FakeClock) -> None:
    registry = EndpointRegistry(dns_fleet(), clock=clock)
    poller = poller_of(registry, source, lookup)
    lookup.addresses(1)
    lookup.gate.clear()
    task = asyncio.create_task(poller.resolve_pools())
    await asyncio.sleep(0)
    registry.apply_fleet(dns_fleet(levers={"prefix_caching": True}), {"a": [ip(7)]})
    lookup.gate.set()
    await asyncio.wait_for(task, 30)
    assert urls_of(registry, "a") == [ip(7)]  # the older look-up is not applied
    await poller.resolve_pools()
    assert urls_of(registry, "a") == [ip(1)]
