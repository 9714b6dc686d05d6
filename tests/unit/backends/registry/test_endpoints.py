"""EndpointRegistry and Poller over a fake MetricsSource and a fake clock."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import pytest

from backends.engines.dialects import EngineDialect
from backends.engines.facts import ADAPTERS, MAX_CONTEXT, Facts, LoadedAdapters
from backends.engines.probe import ProbeError
from backends.registry.endpoints import (
    BreakerConfig,
    CircuitState,
    EndpointRegistry,
    Poller,
    PollResult,
)
from config.fleet_file import Engine, Fleet, parse_fleet
from routing.snapshots import EngineMetrics

A1, A2 = "http://a1:8000", "http://a2:8000"
B1 = "http://b1:8000"
C1 = "http://c1:8000"
M1 = EngineMetrics(running=1.0, waiting=2.0, kv_block_size=16)
M2 = EngineMetrics(running=5.0)


def pool(
    name: str, engine: str, models: list[str], urls: list[str], **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "engine": engine,
        "models": models,
        "endpoints": urls,
        "model": {
            "params": 1e8,
            "layers": 2,
            "hidden_size": 64,
            "kv_heads": 1,
            "head_dim": 64,
            "dtype_bytes": 2,
        },
        "hardware": {"peak_flops": 1e12, "mem_bandwidth": 1e11},
        **extra,
    }


def make_fleet() -> Fleet:
    return parse_fleet(
        {
            "pools": [
                pool("a", "vllm", ["m1", "m2"], [A1, A2 + "/"]),
                pool("b", "sglang", ["m2", "m3"], [B1]),
                pool("c", "vllm", ["m4"], [C1]),
            ]
        }
    )


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


Behaviour = bool | EngineMetrics | Exception | Callable[[], Any]


class FakeSource:
    """Answers from per-URL tables; an unknown URL is refused (its facts: none known).
    Records every call."""

    def __init__(self) -> None:
        self.health_of: dict[str, Behaviour] = {}
        self.metrics_of: dict[str, Behaviour] = {}
        self.facts_of: dict[str, Facts | Exception] = {}
        self.calls: list[tuple[str, str, Engine]] = []

    async def health(self, url: str, dialect: EngineDialect) -> bool:
        self.calls.append(("health", url, dialect.engine))
        result = await self._answer(self.health_of, url)
        assert isinstance(result, bool)
        return result

    async def metrics(self, url: str, dialect: EngineDialect) -> EngineMetrics:
        self.calls.append(("metrics", url, dialect.engine))
        result = await self._answer(self.metrics_of, url)
        assert isinstance(result, EngineMetrics)
        return result

    async def facts(self, url: str, dialect: EngineDialect) -> Facts:
        self.calls.append(("facts", url, dialect.engine))
        answer = self.facts_of.get(url, {})
        if isinstance(answer, Exception):
            raise answer
        return answer

    @staticmethod
    async def _answer(table: dict[str, Behaviour], url: str) -> Any:
        answer = table.get(url, ProbeError(url, "connection refused"))
        if callable(answer):
            answer = await answer()
        if isinstance(answer, Exception):
            raise answer
        return answer


def up(source: FakeSource, url: str, metrics: Behaviour = M1) -> None:
    source.health_of[url] = True
    source.metrics_of[url] = metrics


def down(source: FakeSource, url: str) -> None:
    source.health_of.pop(url, None)
    source.metrics_of.pop(url, None)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> EndpointRegistry:
    return EndpointRegistry(make_fleet(), metrics_ttl_s=10.0, clock=clock)


REFUSED = ProbeError(A1, "connection refused")
SCRAPE_FAILED = ProbeError(A1, "HTTP 500")

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


def test_endpoints_start_unhealthy_until_polled(registry: EndpointRegistry) -> None:
    assert registry.urls == (A1, A2, B1, C1)  # trailing slash of A2 dropped
    assert all(not ep.healthy for p in registry.snapshot() for ep in p.endpoints)
    assert registry.models_available() == []
    assert registry.status(A1).last_poll_at is None


def test_snapshot_mirrors_the_fleet(registry: EndpointRegistry) -> None:
    pools = registry.snapshot()
    assert [(p.name, p.engine, p.role, p.models) for p in pools] == [
        ("a", "vllm", "mixed", ("m1", "m2")),
        ("b", "sglang", "mixed", ("m2", "m3")),
        ("c", "vllm", "mixed", ("m4",)),
    ]
    assert [ep.url for ep in pools[0].endpoints] == [A1, A2]
    assert {ep.pool for ep in pools[0].endpoints} == {"a"}


def test_snapshot_carries_the_levers_numbers(clock: FakeClock) -> None:
    fleet = parse_fleet({"pools": [
        pool("s", "vllm", ["m"], [A1], levers={"speculative": {"num_draft_tokens": 5}}),
        pool("c", "vllm", ["m"], [B1], levers={"chunked_prefill": {"token_budget": 512}}),
    ]})
    spec, chunked = EndpointRegistry(fleet, clock=clock).snapshot()
    # ridge: 1e12 FLOP/s ÷ 1e11 bytes/s × 2 bytes ÷ 2 = 10 tokens per step
    assert (spec.draft_tokens, spec.chunk_tokens, spec.ridge_tokens) == (5, None, 10.0)
    assert (chunked.draft_tokens, chunked.chunk_tokens) == (0, 512)


def test_snapshot_is_frozen_and_cached_until_a_change(registry: EndpointRegistry) -> None:
    first = registry.snapshot()
    assert registry.snapshot() is first
    with pytest.raises(dataclasses.FrozenInstanceError):
        first[0].endpoints[0].healthy = True  # type: ignore[misc]
    registry.record_poll(A1, PollResult(registry.now(), healthy=True))
    second = registry.snapshot()
    assert second is not first
    assert not first[0].endpoints[0].healthy  # an old snapshot never changes
    assert second[0].endpoints[0].healthy
    assert registry.snapshot() is second  # no change since: the same snapshot


def test_a_poll_and_mark_failed_refresh_the_cached_snapshot(registry: EndpointRegistry) -> None:
    registry.record_poll(A1, PollResult(registry.now(), healthy=True))
    assert registry.snapshot()[0].endpoints[0].healthy
    registry.mark_failed(A1, "x")
    assert not registry.snapshot()[0].endpoints[0].healthy


def test_unknown_url_is_a_key_error(registry: EndpointRegistry) -> None:
    with pytest.raises(KeyError, match="unknown endpoint"):
        registry.status("http://nowhere:1")


def test_a_request_outcome_on_an_unknown_url_is_ignored(registry: EndpointRegistry) -> None:
    """A request may outlive its endpoint's drain: its outcome then has nowhere to go."""
    first = registry.snapshot()
    registry.mark_failed("http://nowhere:1", "x")
    registry.mark_succeeded("http://nowhere:1")
    assert registry.snapshot() is first and "http://nowhere:1" not in registry.urls


@pytest.mark.parametrize(
    ("healthy_urls", "expected"),
    [
        (set(), []),
        ({A1}, ["m1", "m2"]),
        ({A2}, ["m1", "m2"]),
        ({B1}, ["m2", "m3"]),
        ({A1, B1}, ["m1", "m2", "m3"]),
        ({A1, A2, B1, C1}, ["m1", "m2", "m3", "m4"]),
        ({C1}, ["m4"]),
    ],
)
async def test_models_union_only_over_healthy_pools(
    registry: EndpointRegistry, healthy_urls: set[str], expected: list[str]
) -> None:
    source = FakeSource()
    for url in healthy_urls:
        up(source, url)
    await Poller(registry, source).poll_once()
    assert registry.models_available() == expected


async def test_mark_failed_holds_until_a_later_poll(
    registry: EndpointRegistry, clock: FakeClock
) -> None:
    source = FakeSource()
    up(source, A1)
    poller = Poller(registry, source)
    await poller.poll_once()
    assert registry.status(A1).healthy

    clock.t += 1
    registry.mark_failed(A1, "connect refused while proxying")
    status = registry.status(A1)
    assert (status.healthy, status.last_error, status.consecutive_failures) == (
        False,
        "connect refused while proxying",
        1,
    )
    assert registry.models_available() == []

    clock.t += 1
    await poller.poll_once()  # the engine answers again: back by itself
    assert registry.status(A1).healthy
    assert registry.status(A1).consecutive_failures == 0


async def test_a_probe_started_before_a_passive_failure_cannot_undo_it(
    registry: EndpointRegistry, clock: FakeClock
) -> None:
    source = FakeSource()
    probe_started, finish_probe = asyncio.Event(), asyncio.Event()

    async def slow_ok() -> bool:
        probe_started.set()
        await finish_probe.wait()
        return True

    source.health_of[A1] = slow_ok
    source.metrics_of[A1] = M2
    poller = Poller(registry, source)
    poll = asyncio.create_task(poller.poll_once())
    await asyncio.wait_for(probe_started.wait(), 5)
    clock.t += 1
    registry.mark_failed(A1, "proxy could not connect")
    finish_probe.set()
    await asyncio.wait_for(poll, 5)

    status = registry.status(A1)
    assert not status.healthy
    assert status.last_error == "proxy could not connect"
    assert status.metrics == M2  # the figures are still news

    up(source, A1)
    clock.t += 1
    await poller.poll_once()
    assert registry.status(A1).healthy


async def test_stale_metrics_are_hidden_after_the_ttl(
    registry: EndpointRegistry, clock: FakeClock
) -> None:
    source = FakeSource()
    up(source, A1, M1)
    poller = Poller(registry, source)
    await poller.poll_once()
    source.metrics_of[A1] = SCRAPE_FAILED  # health stays OK, every scrape fails from now on

    clock.t += 5
    await poller.poll_once()
    assert registry.snapshot()[0].endpoints[0].metrics == M1  # cached snapshot, still fresh
    clock.t += 5.5  # 10.5 s after the last good scrape; ttl is 10 s
    shown = registry.snapshot()[0].endpoints[0]
    assert shown.healthy
    assert shown.metrics == EngineMetrics()
    assert registry.status(A1).metrics == M1  # the registry still knows what it last saw


async def test_ttl_none_keeps_metrics_forever(clock: FakeClock) -> None:
    registry = EndpointRegistry(make_fleet(), metrics_ttl_s=None, clock=clock)
    registry.record_poll(A1, PollResult(clock.t, healthy=True, metrics=M1))
    clock.t += 1e6
    assert registry.snapshot()[0].endpoints[0].metrics == M1


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


# -- the circuit breaker -----------------------------------------------------------------------

BREAKER = BreakerConfig(failures=3, open_s=5.0, max_open_s=12.0)


@pytest.fixture
def guarded(clock: FakeClock) -> EndpointRegistry:
    """A registry with a small breaker cap (5 s, 10 s, then 12 s) and A1 polled healthy."""
    registry = EndpointRegistry(make_fleet(), breaker=BREAKER, clock=clock)
    probe_passes(registry, clock)
    return registry


def probe_passes(registry: EndpointRegistry, clock: FakeClock, url: str = A1) -> None:
    """A health probe of ``url`` starts one second later and passes."""
    clock.t += 1
    registry.record_poll(url, PollResult(clock.t, healthy=True))


def fail_until_open(registry: EndpointRegistry, clock: FakeClock) -> None:
    """Fail A1's requests (a passing probe after each) until its breaker opens."""
    while registry.status(A1).circuit is CircuitState.CLOSED:
        registry.mark_failed(A1, "engine reset the connection")
        if registry.status(A1).circuit is CircuitState.CLOSED:
            probe_passes(registry, clock)


def routable(registry: EndpointRegistry, url: str = A1) -> bool:
    return next(ep.healthy for p in registry.snapshot() for ep in p.endpoints if ep.url == url)


def test_the_breaker_opens_after_n_consecutive_failures_and_not_before(
    guarded: EndpointRegistry, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="backends.registry.endpoints")
    for count in (1, 2):
        guarded.mark_failed(A1, "engine reset the connection")
        probe_passes(guarded, clock)  # the probe passes: plain passive health lets it back
        status = guarded.status(A1)
        assert (status.circuit, status.request_failures, status.healthy) == (
            CircuitState.CLOSED, count, True)
        assert routable(guarded)
    guarded.mark_failed(A1, "answered the invalid HTTP status 999")
    status = guarded.status(A1)
    assert (status.circuit, status.request_failures, status.healthy) == (
        CircuitState.OPEN, 3, False)
    assert status.circuit_open_until == clock.t + 5.0
    assert not routable(guarded)
    [warning] = [r for r in caplog.records
                 if r.levelno == logging.WARNING and "circuit breaker" in r.getMessage()]
    for part in (A1, "pool a", "after 3 ", "5.0 s", "invalid HTTP status 999"):
        assert part in warning.getMessage()


def test_a_success_in_between_resets_the_count(
    guarded: EndpointRegistry, clock: FakeClock
) -> None:
    for outcome in ("fail", "fail", "ok", "fail", "fail"):
        if outcome == "ok":
            guarded.mark_succeeded(A1)
        else:
            guarded.mark_failed(A1, "refused")
            probe_passes(guarded, clock)
    status = guarded.status(A1)
    assert (status.circuit, status.request_failures, status.healthy) == (
        CircuitState.CLOSED, 2, True)


async def test_passing_probes_do_not_bring_an_open_endpoint_back(
    guarded: EndpointRegistry, clock: FakeClock
) -> None:
    source = FakeSource()
    up(source, A1)
    poller = Poller(guarded, source)
    fail_until_open(guarded, clock)
    opened_until = guarded.status(A1).circuit_open_until
    assert opened_until is not None
    while clock.t + 1 < opened_until:
        clock.t += 1
        await poller.poll_once()  # the engine's health probe passes every time
        assert guarded.status(A1).circuit is CircuitState.OPEN
        assert not guarded.status(A1).healthy and not routable(guarded)
        assert guarded.models_available() == []  # A1 was the one healthy endpoint


async def test_a_probe_started_inside_the_open_period_cannot_end_it(
    guarded: EndpointRegistry, clock: FakeClock
) -> None:
    fail_until_open(guarded, clock)
    started = clock.t + 4.9  # starts 0.1 s before the period ends, answers after it
    clock.t += 5.5
    guarded.record_poll(A1, PollResult(started, healthy=True))
    assert guarded.status(A1).circuit is CircuitState.HALF_OPEN
    assert not guarded.status(A1).healthy and not routable(guarded)


def test_half_open_after_the_open_period_and_a_passing_probe(
    guarded: EndpointRegistry, clock: FakeClock
) -> None:
    fail_until_open(guarded, clock)
    before = guarded.snapshot()
    clock.t += 5.0
    assert guarded.status(A1).circuit is CircuitState.HALF_OPEN
    assert not routable(guarded)  # not before a probe says it answers
    probe_passes(guarded, clock)
    after = guarded.snapshot()
    assert after is not before and routable(guarded)
    status = guarded.status(A1)
    assert (status.circuit, status.healthy) == (CircuitState.HALF_OPEN, True)


def test_a_success_in_half_open_closes_the_breaker_and_resets_the_open_time(
    guarded: EndpointRegistry, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="backends.registry.endpoints")
    fail_until_open(guarded, clock)
    clock.t += 5.0
    probe_passes(guarded, clock)
    guarded.mark_failed(A1, "reset")  # half-open: reopens for 10 s
    clock.t += 10.0
    probe_passes(guarded, clock)
    guarded.mark_succeeded(A1)
    status = guarded.status(A1)
    assert (status.circuit, status.request_failures, status.circuit_open_until) == (
        CircuitState.CLOSED, 0, None)
    assert status.healthy
    breaker = [r for r in caplog.records
               if r.levelno == logging.INFO and "circuit breaker" in r.getMessage()]
    assert len(breaker) == 1 and caplog.records[-1] is breaker[0]
    assert "closed" in breaker[0].getMessage() and A1 in breaker[0].getMessage()
    fail_until_open(guarded, clock)
    assert guarded.status(A1).circuit_open_until == clock.t + 5.0  # the base time again


def test_a_failure_in_half_open_reopens_at_once_for_double_the_time_capped(
    guarded: EndpointRegistry, clock: FakeClock
) -> None:
    fail_until_open(guarded, clock)
    open_times = [5.0]
    for _ in range(3):
        clock.t += open_times[-1]
        probe_passes(guarded, clock)
        assert routable(guarded)
        guarded.mark_failed(A1, "stream broke off")  # the first request after it fails
        status = guarded.status(A1)
        assert status.circuit is CircuitState.OPEN and not routable(guarded)
        assert status.circuit_open_until is not None
        open_times.append(status.circuit_open_until - clock.t)
    assert open_times == [5.0, 10.0, 12.0, 12.0]


def test_outcomes_while_open_change_nothing(guarded: EndpointRegistry, clock: FakeClock) -> None:
    """Requests sent before the breaker opened may end while it is open."""
    fail_until_open(guarded, clock)
    opened = guarded.status(A1)
    clock.t += 1
    guarded.mark_failed(A1, "late failure")
    guarded.mark_succeeded(A1)
    status = guarded.status(A1)
    assert (status.circuit, status.circuit_open_until) == (
        CircuitState.OPEN, opened.circuit_open_until)
    clock.t += 4.0
    probe_passes(guarded, clock)  # the period ended on time: the late failure did not extend it
    assert routable(guarded)


def test_mark_succeeded_on_a_closed_breaker_costs_nothing() -> None:
    reads: list[float] = []

    def clock() -> float:
        reads.append(100.0)
        return 100.0

    registry = EndpointRegistry(make_fleet(), breaker=BREAKER, clock=clock)
    registry.record_poll(A1, PollResult(clock(), healthy=True))
    first = registry.snapshot()
    reads.clear()
    for _ in range(100):
        registry.mark_succeeded(A1)
    assert reads == []  # not even the clock is read
    assert registry.snapshot() is first  # and nothing to rebuild
    registry.mark_failed(A1, "refused")
    registry.record_poll(A1, PollResult(clock(), healthy=True))
    second = registry.snapshot()
    registry.mark_succeeded(A1)  # resets a count the snapshots do not show
    assert registry.status(A1).request_failures == 0 and registry.snapshot() is second


@pytest.mark.parametrize(("failures", "open_s", "max_open_s"), [
    (0, 5.0, 60.0), (3, 0.0, 60.0), (3, 5.0, 0.0), (3, -1.0, 60.0)])
def test_breaker_config_rejects_impossible_values(
    failures: int, open_s: float, max_open_s: float
) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(failures, open_s, max_open_s)


def test_the_open_time_doubles_up_to_its_cap() -> None:
    assert [BreakerConfig().next_open_s(t) for t in (None, 5.0, 20.0, 40.0)] == [
        5.0, 10.0, 40.0, 60.0]
    assert BreakerConfig(open_s=90.0).next_open_s(None) == 60.0  # the cap caps the first too


# -- the lever check -------------------------------------------------------------------------------

SPEC_ON = {"prefix_cache": True, "chunked_prefill": False, "speculative": True, "draft_tokens": 4}
SPEC_OFF = {"prefix_cache": True, "chunked_prefill": False, "speculative": False}


def lever_fleet() -> Fleet:
    """Pool a (A1, A2) declares prefix caching and n-gram speculation (K = 4)."""
    levers = {"prefix_caching": True, "speculative": {"method": "ngram", "num_draft_tokens": 4}}
    return parse_fleet({"pools": [pool("a", "vllm", ["m1"], [A1, A2], levers=levers),
                                  pool("b", "sglang", ["m2"], [B1])]})


@pytest.fixture
def checked(clock: FakeClock) -> EndpointRegistry:
    return EndpointRegistry(lever_fleet(), clock=clock)


def facts_reads(source: FakeSource, url: str) -> int:
    return sum(1 for what, u, _ in source.calls if what == "facts" and u == url)


async def test_facts_are_read_once_healthy_and_again_after_being_down(
    checked: EndpointRegistry, clock: FakeClock
) -> None:
    source = FakeSource()
    up(source, A1)
    source.facts_of[A1] = SPEC_ON
    poller = Poller(checked, source)
    for _ in range(3):
        clock.t += 1
        await poller.poll_once()
    assert facts_reads(source, A1) == 1  # not at every poll
    assert facts_reads(source, A2) == facts_reads(source, B1) == 0  # never healthy
    down(source, A1)
    clock.t += 1
    await poller.poll_once()
    assert facts_reads(source, A1) == 1  # not while down
    up(source, A1)
    for _ in range(2):
        clock.t += 1
        await poller.poll_once()
    assert facts_reads(source, A1) == 2  # once more: it may be another engine now
    check = checked.status(A1).lever_check
    assert check.checked == ("prefix_cache", "chunked_prefill", "speculative", "draft_tokens")
    assert check.mismatches == ()


async def test_a_missing_lever_reaches_the_snapshot_the_status_and_the_log_once(
    checked: EndpointRegistry, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="backends.registry.endpoints")
    source = FakeSource()
    up(source, A1)
    source.facts_of[A1] = SPEC_OFF
    poller = Poller(checked, source)
    await poller.poll_once()
    status = checked.status(A1)
    assert [(m.lever, m.declared, m.observed) for m in status.lever_check.mismatches] == [
        ("speculative", True, False)]
    a = checked.snapshot()[0]
    assert a.endpoints[0].missing_levers == {"speculative"}
    assert "speculative" not in a.offered  # its only healthy endpoint lacks it
    up(source, A2)
    source.facts_of[A2] = SPEC_ON
    await poller.poll_once()
    a = checked.snapshot()[0]
    assert "speculative" in a.offered and a.lacking == {"speculative": {A1}}
    for _ in range(2):  # A1 goes down and comes back, still without speculation
        down(source, A1)
        clock.t += 1
        await poller.poll_once()
        up(source, A1)
        clock.t += 1
        await poller.poll_once()
    assert facts_reads(source, A1) == 3
    warned = [r.getMessage() for r in caplog.records if "lever" in r.getMessage()]
    assert warned == [f"endpoint {A1} (pool a): lever speculative declared on, the engine "
                      "reports off; the router no longer counts on it there"]
    source.facts_of[A1] = SPEC_ON  # restarted with speculation
    down(source, A1)
    clock.t += 1
    await poller.poll_once()
    up(source, A1)
    clock.t += 1
    await poller.poll_once()
    assert checked.snapshot()[0].lacking == {}
    assert caplog.records[-1].levelno == logging.INFO
    assert caplog.records[-1].getMessage() == (
        f"endpoint {A1} (pool a): lever speculative is now as declared")


def test_facts_read_while_the_endpoint_went_down_are_dropped(
    checked: EndpointRegistry, clock: FakeClock
) -> None:
    checked.record_poll(A1, PollResult(clock.t, healthy=True))
    started = clock.t  # the facts read starts ...
    clock.t += 1
    checked.mark_failed(A1, "connection reset")  # ... the engine goes away ...
    clock.t += 1
    checked.record_poll(A1, PollResult(clock.t, healthy=True))  # ... and a new one answers
    checked.record_facts(A1, SPEC_OFF, started)  # the old engine's facts
    assert checked.status(A1).lever_check.checked == ()
    assert checked.facts_due(A1)  # the new engine's facts are still to be read
    checked.record_facts(A1, SPEC_OFF, clock.t)
    assert checked.status(A1).lever_check.missing == {"speculative"}
    assert not checked.facts_due(A1)


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


# -- operator logs: transitions only -------------------------------------------------------------


def logged(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    caplog.clear()
    return lines


async def test_health_transitions_are_logged_once_each(
    registry: EndpointRegistry, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="backends.registry.endpoints")
    source = FakeSource()
    up(source, A1)
    up(source, C1)
    poller = Poller(registry, source)
    await poller.poll_once()
    assert sorted(logged(caplog)) == sorted([
        ("INFO", f"endpoint {A1} (pool a) is up"),
        ("WARNING", f"endpoint {A2} (pool a) is down: health: connection refused"),
        ("WARNING", f"endpoint {B1} (pool b) is down: health: connection refused"),
        ("WARNING", "pool b has no healthy endpoint"),
        ("INFO", f"endpoint {C1} (pool c) is up"),
    ])
    for _ in range(3):  # nothing changes: nothing is logged
        clock.t += 1
        await poller.poll_once()
    assert logged(caplog) == []
    down(source, A1)
    clock.t += 1
    await poller.poll_once()
    assert logged(caplog) == [
        ("WARNING", f"endpoint {A1} (pool a) is down: health: connection refused"),
        ("WARNING", f"pool a lost its last healthy endpoint ({A1}: health: connection refused)"),
    ]
    up(source, A2)
    clock.t += 2.5
    await poller.poll_once()
    assert logged(caplog) == [  # A2 was down from the first poll on
        ("INFO", f"endpoint {A2} (pool a) is back up after 6.5 s down"),
        ("INFO", f"pool a has a healthy endpoint again ({A2})"),
    ]
    registry.mark_failed(A2, "the engine's stream broke off")
    registry.mark_failed(A2, "the engine's stream broke off")  # already down: no second line
    assert logged(caplog) == [
        ("WARNING", f"endpoint {A2} (pool a) is down: the engine's stream broke off"),
        ("WARNING", f"pool a lost its last healthy endpoint ({A2}: the engine's stream broke "
                    "off)"),
    ]


def test_credentials_in_urls_never_reach_the_log(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="backends.registry.endpoints")
    secret = "http://ops:s3cret@d1:8000"
    registry = EndpointRegistry(
        parse_fleet({"pools": [pool("d", "vllm", ["m"], [secret])]}),
        breaker=BreakerConfig(failures=1), clock=clock)
    registry.record_poll(secret, PollResult(clock.t, healthy=True))
    registry.mark_failed(secret, f"request failed: {secret}/v1/completions: reset")
    clock.t += 10
    registry.record_poll(secret, PollResult(clock.t, healthy=True))
    registry.mark_succeeded(secret)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) >= 5 and all("s3cret" not in m for m in messages)
    assert "endpoint http://d1:8000 (pool d) is down: request failed: http://d1:8000/v1/" \
           "completions: reset" in messages


# -- LoRA adapters ---------------------------------------------------------------------------------

def lora_fleet() -> Fleet:
    """Pool a (A1, A2) declares the adapter sql-lora; pool b (B1) declares none."""
    return parse_fleet({"pools": [pool("a", "vllm", ["m1"], [A1, A2], adapters=["sql-lora"]),
                                  pool("b", "vllm", ["m2"], [B1])]})


def listing(*adapters: tuple[str, str]) -> Facts:
    return {MAX_CONTEXT: 2048, ADAPTERS: LoadedAdapters(tuple(sorted(adapters)))}


async def test_adapters_listed_by_an_engine_reach_the_snapshot_and_the_model_list(
    clock: FakeClock
) -> None:
    registry = EndpointRegistry(lora_fleet(), clock=clock)
    source = FakeSource()
    for url in (A1, A2, B1):
        up(source, url)
    source.facts_of[A1] = listing(("sql-lora", "m1"))
    source.facts_of[B1] = listing(("chat-lora", "m2"))  # loaded at runtime, not declared
    source.facts_of[A2] = {MAX_CONTEXT: 2048}  # its model list has no adapter
    await Poller(registry, source).poll_once()
    a, b = registry.snapshot()
    assert [e.adapters for e in a.endpoints] == [{"sql-lora"}, frozenset()]
    assert a.adapters == {"sql-lora"} and a.serves("sql-lora") and not a.serves("chat-lora")
    assert b.adapters == frozenset() and b.serves("chat-lora")
    assert registry.model_parents() == {"chat-lora": "m2", "m1": None, "m2": None,
                                        "sql-lora": "m1"}
    assert registry.models_available() == ["chat-lora", "m1", "m2", "sql-lora"]
    down(source, B1)
    clock.t += 1
    await Poller(registry, source).poll_once()
    assert registry.models_available() == ["m1", "sql-lora"]  # b has no healthy endpoint


async def test_adapters_are_read_again_while_healthy(clock: FakeClock) -> None:
    registry = EndpointRegistry(lora_fleet(), facts_every_s=30.0, clock=clock)
    source = FakeSource()
    up(source, B1)
    poller = Poller(registry, source)
    source.facts_of[B1] = {MAX_CONTEXT: 2048}
    await poller.poll_once()
    source.facts_of[B1] = listing(("chat-lora", "m2"))  # loaded into the running engine
    clock.t += 10
    await poller.poll_once()
    assert not registry.snapshot()[1].serves("chat-lora")  # not read again yet
    clock.t += 25
    await poller.poll_once()
    assert registry.snapshot()[1].endpoints[0].adapters == {"chat-lora"}
    assert facts_reads(source, B1) == 2
    source.facts_of[B1] = {}  # the model list could not be read: keep what was known
    clock.t += 31
    await poller.poll_once()
    assert registry.snapshot()[1].serves("chat-lora")
    source.facts_of[B1] = {MAX_CONTEXT: 2048}  # read, and the adapter is gone (unloaded)
    clock.t += 31
    await poller.poll_once()
    assert not registry.snapshot()[1].serves("chat-lora")
