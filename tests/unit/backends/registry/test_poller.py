"""Poller over a fake MetricsSource, a fake clock and stub DNS look-ups: what a probe finds,
concurrent rounds, the background task, and the ``resolve: dns`` pools followed at every
round."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from backends.engines.probe import ProbeError
from backends.registry.endpoints import EndpointRegistry
from backends.registry.poller import Poller
from backends.registry.resolver import DnsResolver
from config.engines import Engine
from routing.snapshots import EngineMetrics
from tests.unit.backends.registry.fakes import (
    A1,
    A2,
    B1,
    C1,
    M1,
    M2,
    SCRAPE_FAILED,
    Behaviour,
    FakeClock,
    FakeSource,
    StubLookup,
    dns_fleet,
    down,
    facts_reads,
    ip,
    poller_of,
    up,
    urls_of,
)

REFUSED = ProbeError(A1, "connection refused")

# each step: (health answer, metrics answer); expected after the last step:
# (healthy, metrics, last_error substring or None, consecutive failures)
SCENARIOS: dict[
    str, tuple[list[tuple[Behaviour, Behaviour]], tuple[bool, EngineMetrics, str | None, int]]
] = {
    "healthy": ([(True, M1)], (True, M1, None, 0)),
    "down": ([(REFUSED, M1)], (False, EngineMetrics(), "health: connection refused", 1)),
    "down twice": ([(REFUSED, M1), (REFUSED, M1)], (False, EngineMetrics(), "refused", 2)),
    "back up": ([(REFUSED, M1), (REFUSED, M1), (True, M2)], (True, M2, None, 0)),
    "not ready": ([(False, M1)], (False, EngineMetrics(), "not ready", 1)),
    "metrics failure keeps old metrics": (
        [(True, M1), (True, SCRAPE_FAILED)],
        (True, M1, "metrics: HTTP 500", 0),
    ),
    "metrics failure before any metrics": (
        [(True, SCRAPE_FAILED)],
        (True, EngineMetrics(), "metrics: HTTP 500", 0),
    ),
    "down keeps last metrics": ([(True, M1), (REFUSED, M2)], (False, M1, "refused", 1)),
    "source bug counts as down": (
        [(RuntimeError("boom"), M1)],
        (False, EngineMetrics(), "health: RuntimeError: boom", 1),
    ),
    "metrics bug keeps healthy": (
        [(True, KeyError("x"))],
        (True, EngineMetrics(), "metrics: KeyError", 0),
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_poll_scenarios(name: str, registry: EndpointRegistry, clock: FakeClock) -> None:
    steps, (healthy, metrics, error, failures) = SCENARIOS[name]
    source = FakeSource()
    poller = Poller(registry, source, interval_s=1.0)
    for health, scraped in steps:
        source.health_of[A1] = health
        source.metrics_of[A1] = scraped
        clock.t += 1.0
        await poller.poll_once()
    status = registry.status(A1)
    assert status.healthy is healthy
    assert status.metrics == metrics
    assert status.consecutive_failures == failures
    assert status.last_poll_at == clock.t
    if error is None:
        assert status.last_error is None
    else:
        assert status.last_error is not None and error in status.last_error
    [a] = [p for p in registry.snapshot() if p.name == "a"]
    assert a.endpoints[0].healthy is healthy


async def test_each_endpoint_is_probed_with_its_own_dialect(registry: EndpointRegistry) -> None:
    source = FakeSource()
    for url in (A1, A2, B1, C1):
        up(source, url)
    await Poller(registry, source).poll_once()
    health_calls = sorted((url, engine) for kind, url, engine in source.calls if kind == "health")
    assert health_calls == [
        (A1, Engine.VLLM),
        (A2, Engine.VLLM),
        (B1, Engine.SGLANG),
        (C1, Engine.VLLM),
    ]
    assert all(registry.status(u).healthy for u in registry.urls)


async def test_poll_once_probes_endpoints_concurrently(registry: EndpointRegistry) -> None:
    source = FakeSource()
    arrived: list[str] = []
    everyone_here = asyncio.Event()

    def waiting_for_all(url: str) -> Callable[[], Any]:
        async def answer() -> bool:
            arrived.append(url)
            if len(arrived) == len(registry.urls):
                everyone_here.set()
            await everyone_here.wait()  # deadlocks if probes ran one after another
            return True

        return answer

    for url in registry.urls:
        source.health_of[url] = waiting_for_all(url)
        source.metrics_of[url] = M1
    await asyncio.wait_for(Poller(registry, source).poll_once(), 5)
    assert sorted(arrived) == sorted(registry.urls)


def test_poller_rejects_bad_interval(registry: EndpointRegistry) -> None:
    with pytest.raises(ValueError):
        Poller(registry, FakeSource(), interval_s=0)


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``condition`` every 10 ms; fail the test after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def test_background_poller_follows_an_endpoint_down_and_up(
    registry: EndpointRegistry,
) -> None:
    source = FakeSource()
    up(source, A1)
    tasks_before = asyncio.all_tasks()
    async with asyncio.timeout(10), Poller(registry, source, interval_s=0.01) as poller:
        assert poller.running
        assert await poller.wait_until_polled(5)
        assert registry.status(A1).healthy
        down(source, A1)
        await wait_for(lambda: not registry.status(A1).healthy)
        up(source, A1, M2)
        await wait_for(lambda: registry.status(A1).healthy)
        assert registry.status(A1).metrics == M2
    assert not poller.running
    assert asyncio.all_tasks() == tasks_before  # nothing leaked


async def test_wait_until_polled_times_out_and_stop_cancels_a_hung_probe(
    registry: EndpointRegistry,
) -> None:
    source = FakeSource()
    cancelled = asyncio.Event()

    async def hang() -> bool:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return True

    source.health_of[A1] = hang
    tasks_before = asyncio.all_tasks()
    poller = Poller(registry, source, interval_s=0.01)
    poller.start()
    assert await poller.wait_until_polled(0.05) is False
    await asyncio.wait_for(poller.stop(), 5)
    assert cancelled.is_set()
    assert not poller.running
    assert asyncio.all_tasks() == tasks_before
    await poller.stop()  # twice is fine


async def test_stop_does_not_swallow_its_callers_cancellation(
    registry: EndpointRegistry,
) -> None:
    source = FakeSource()
    probing = asyncio.Event()

    async def slow_to_clean_up() -> bool:
        probing.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # cleanup that takes a while
            raise
        return True

    source.health_of[A1] = slow_to_clean_up
    tasks_before = asyncio.all_tasks()
    poller = Poller(registry, source, interval_s=0.01)
    poller.start()
    await asyncio.wait_for(probing.wait(), 5)
    stopping = asyncio.create_task(poller.stop())
    await asyncio.sleep(0.02)  # stop() is now waiting for the probe's cleanup
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(stopping, 5)
    await wait_for(lambda: asyncio.all_tasks() == tasks_before)  # the poller still ended


async def test_start_twice_is_an_error(registry: EndpointRegistry) -> None:
    poller = Poller(registry, FakeSource(), interval_s=0.01)
    poller.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            poller.start()
    finally:
        await poller.stop()
    poller.start()  # a stopped poller can start again
    await poller.stop()


async def test_a_failing_facts_read_is_logged_not_retried_at_every_poll(
    checked: EndpointRegistry, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    source = FakeSource()
    up(source, A1)
    source.facts_of[A1] = RuntimeError("bug")
    poller = Poller(checked, source)
    for _ in range(3):
        clock.t += 1
        await poller.poll_once()
    assert facts_reads(source, A1) == 1
    assert checked.status(A1).healthy and checked.status(A1).lever_check.checked == ()
    assert sum("reading the engine facts" in r.getMessage() for r in caplog.records) == 1


# -- resolve: dns pools, followed at every round ---------------------------------------------------


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
