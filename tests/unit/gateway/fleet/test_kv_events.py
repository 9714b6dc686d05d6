"""The gateway's KV-event wiring: which endpoints it follows as the fleet changes, the index
they feed, its cap and its gauges. A fake engine publishes on real ZMQ sockets
(:class:`tests.unit.backends.kv_events.test_subscriber.Engine`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import zmq.asyncio
from prometheus_client import CollectorRegistry

from backends.engines.kv_capacity import host_tier_tokens
from backends.kv_events.subscriber import KvEventSubscribers, SubscriberSettings
from config.fleet import Fleet, parse_fleet
from gateway.fleet.kv_events import (
    FALLBACK_BLOCKS,
    EngineEvents,
    KvEventGauges,
    index_blocks,
    reload_ratio,
    with_engine_events,
)
from routing.features import token_block_hashes
from routing.kv_events.events import BlocksStored
from routing.kv_events.index import KvEventIndex
from routing.kv_events.state import EventState
from routing.snapshots import EndpointSnapshot, PoolSnapshot
from routing.state.memory import MemoryState
from tests.unit.backends.kv_events.test_subscriber import Engine, until

URL = "http://127.0.0.1:8001"
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 8192}


def fleet(events: dict[str, Any] | None, kv_cache_bytes: float | None = None) -> Fleet:
    """One vLLM pool; without ``kv_cache_bytes``, without facts (its KV capacity unknown)."""
    pool: dict[str, Any] = {"name": "p", "engine": "vllm", "models": ["m", "alias"],
                            "endpoints": [URL], "levers": {"prefix_caching": True}}
    if kv_cache_bytes is not None:
        pool["model"] = FACTS
        pool["hardware"] = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9,
                            "kv_cache_bytes": kv_cache_bytes}
    if events is not None:
        pool["kv_events"] = events
    return parse_fleet({"pools": [pool]})


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)


def snapshot(*urls: str) -> tuple[PoolSnapshot, ...]:
    return (PoolSnapshot(name="p", engine="vllm", role="mixed", models=("m", "alias"),
                         endpoints=tuple(EndpointSnapshot(u, "p", True) for u in urls)),)


def test_a_fleet_without_events_keeps_its_state() -> None:
    state = MemoryState()
    assert with_engine_events(fleet(None), 16, state) == (state, None)


def test_the_index_holds_twice_the_engines_capacity() -> None:
    # 131,072 B/token: 2 · 32 layers · 8 heads · 128 · 2 B; 1,310,720,000 B hold 10,000 tokens
    sized = fleet({"port": 5557}, kv_cache_bytes=131_072 * 10_000)
    assert index_blocks(sized, 16) == 2 * 625
    assert index_blocks(fleet({"port": 5557}), 16) == FALLBACK_BLOCKS
    state, events = with_engine_events(sized, 16, MemoryState())
    assert isinstance(state, EventState) and events is not None
    assert events.index.max_blocks == 1250


def test_a_host_tier_is_priced_from_the_pools_facts_and_sized_into_the_index() -> None:
    raw = fleet({"port": 5557}, kv_cache_bytes=131_072 * 10_000).model_dump(mode="json")
    pool = raw["pools"][0]
    pool["levers"]["host_kv_cache"] = {"size_gb": 1.31072}  # 10,000 tokens of 131,072 B
    pool["hardware"]["peak_flops"] = 989e12
    tiered = parse_fleet(raw)
    [p] = tiered.pools
    assert host_tier_tokens(p) == 10_000
    assert index_blocks(tiered, 16) == 2 * 1250  # device and host tier
    # 131,072 B/token over 25e9 B/s against 2 · 8.03e9 FLOP at 989e12 FLOP/s
    assert reload_ratio(p) == pytest.approx(0.3228, rel=1e-3)
    assert reload_ratio(fleet({"port": 5557}).pools[0]) == 0.0


async def test_followed_endpoints_feed_the_index_and_the_gauges(
        context: zmq.asyncio.Context) -> None:
    engine = Engine(context)
    source = engine.source()
    publish, replay = source.publish, source.replay
    served = fleet({"port": 1, "addresses": [publish], "replay_addresses": [replay],
                    "topic": source.topic})
    index = KvEventIndex(16, 10_000)
    events = EngineEvents(index, KvEventSubscribers(index, SubscriberSettings(),
                                                    context=context))
    try:
        await events.follow_fleet(served, snapshot(URL))
        assert index.follows(URL)
        await engine.subscribed()
        ids = list(range(32))
        engine.publish(0, engine.codec.encode(time.time(), [BlocksStored([b"a"], None, ids, 32)]))
        await until(lambda: len(index) == 4, "the stored block")  # 2 models × 2 router blocks
        assert index.match(token_block_hashes(ids, 16, "alias"), [URL]) == {URL: 2}
        registry = CollectorRegistry()
        registry.register(KvEventGauges(events))
        assert registry.get_sample_value("ridge_kv_event_index_blocks") == 4
        assert registry.get_sample_value("ridge_kv_events_batches_total", {"endpoint": URL}) == 1
        await events.follow_fleet(fleet(None), snapshot(URL))  # the pool lost kv_events
        assert not index.follows(URL) and events.subscribers.sources() == {}
    finally:
        await events.aclose()
        await engine.close()
