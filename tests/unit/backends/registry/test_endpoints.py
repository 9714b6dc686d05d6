"""EndpointRegistry over a fake MetricsSource and a fake clock: the snapshot, the health
rules, the lever check, the log of health transitions and LoRA adapters."""

from __future__ import annotations

import asyncio
import logging

import pytest

import routing.snapshots
from backends.engines.facts import ADAPTERS, MAX_CONTEXT, Facts, LoadedAdapters
from backends.registry.endpoints import EndpointRegistry
from backends.registry.poller import Poller
from backends.registry.status import PollResult
from config.fleet import Fleet, parse_fleet
from routing.snapshots import EngineMetrics
from tests.unit.backends.registry.fakes import (
    A1,
    A2,
    B1,
    C1,
    M1,
    M2,
    SCRAPE_FAILED,
    SPEC_OFF,
    SPEC_ON,
    FakeClock,
    FakeSource,
    down,
    facts_reads,
    make_fleet,
    pool,
    up,
)

COMPILED = not (routing.snapshots.__file__ or "").endswith(".py")


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
    if COMPILED:  # the sources: Final is the type checker's alone
        with pytest.raises(AttributeError):
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


# -- the lever check -------------------------------------------------------------------------------


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


# -- operator logs: transitions only ---------------------------------------------------------------


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
