"""The circuit breaker through the registry: it opens after N failed requests, half-opens
after its open period, closes on a success and reopens for longer on a failure; its
configuration."""

from __future__ import annotations

import logging

import pytest

from backends.registry.breaker import BreakerConfig, CircuitState
from backends.registry.endpoints import EndpointRegistry
from backends.registry.poller import Poller
from backends.registry.status import PollResult
from tests.unit.backends.registry.fakes import A1, FakeClock, FakeSource, make_fleet, up

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
