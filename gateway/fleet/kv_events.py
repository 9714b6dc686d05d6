"""The engines' KV-cache events in the gateway: the precise index, its subscribers, its gauges.

When a pool sets ``kv_events``, :class:`EngineEvents` keeps a
:class:`routing.kv_events.index.KvEventIndex` of the blocks those engines report, fed by one
ZMQ subscriber per endpoint (:class:`backends.kv_events.subscriber.KvEventSubscribers`), and
wraps the router state in a :class:`routing.kv_events.state.EventState`. A fleet without
``kv_events`` gets none of it. :meth:`EngineEvents.follow_fleet` (at start-up and every
``interval_s``) follows the endpoints the registry has now and drops the others.

The index holds :func:`index_blocks` router blocks (twice the followed engines' KV capacity,
:data:`FALLBACK_BLOCKS` when unknown); host-only blocks are priced at :func:`reload_ratio`.
It exports the ``ridge_kv_event*`` gauges and counters. See
docs/gateway.md#kv-cache-event-subscribers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.engines.kv_capacity import engine_cache_tokens
from backends.kv_events.subscriber import KvEventCounters, KvEventSubscribers, wanted_sources
from config.fleet import Fleet
from config.pools import Pool
from routing.formulas import host_reload_ratio
from routing.kv_events.index import BYTES_PER_BLOCK, BYTES_PER_PAGE, KvEventIndex
from routing.kv_events.state import EventState
from routing.prefix_index import entries_to_remember
from routing.snapshots import PoolSnapshot
from routing.state.protocol import RouterState

log = logging.getLogger(__name__)

FALLBACK_BLOCKS = 2_000_000
"""[router blocks] The index's cap when a followed engine's KV capacity is unknown (~800 MB of
router blocks at :data:`routing.kv_events.index.BYTES_PER_BLOCK`)."""


def event_pools(fleet: Fleet) -> list[Pool]:
    return [p for p in fleet.pools if p.kv_events is not None]


def index_blocks(fleet: Fleet, block_tokens: int) -> int:
    """The index's cap [router blocks]: :func:`~routing.prefix_index.entries_to_remember`, 2 ×
    Σ ⌈KV tokens ÷ block_tokens⌉, over the endpoints of the ``kv_events`` pools (device and host
    tier), or :data:`FALLBACK_BLOCKS` when one's capacity is unknown."""
    tokens = [engine_cache_tokens(pool) for pool in event_pools(fleet) for _ in pool.endpoints]
    known = [t for t in tokens if t is not None]
    if len(known) < len(tokens):
        return FALLBACK_BLOCKS
    return max(1, entries_to_remember(known, block_tokens))


def reload_ratio(pool: Pool) -> float:
    """What reloading a block from the pool's host tier costs against recomputing it
    (:func:`routing.formulas.host_reload_ratio`); 0 without a host tier or the facts (host
    blocks then count as held)."""
    model, hardware = pool.model, pool.hardware
    if pool.levers.host_kv_cache is None or model is None or hardware is None:
        return 0.0
    per_token = model.to_shape(pool.levers.kv_dtype_bytes).kv_bytes_per_token
    return host_reload_ratio(per_token, hardware.host_link_bandwidth, model.params,
                             hardware.peak_flops)


class EngineEvents:
    """The index, the subscribers feeding it and what they follow (module docstring)."""

    def __init__(self, index: KvEventIndex, subscribers: KvEventSubscribers | None = None,
                 interval_s: float = 2.0) -> None:
        self.index = index
        self.subscribers = subscribers or KvEventSubscribers(index)
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def follow_fleet(self, fleet: Fleet, pools: Sequence[PoolSnapshot]) -> None:
        """Follow exactly the endpoints of ``fleet``'s ``kv_events`` pools as ``pools`` (the
        registry's snapshot) has them now."""
        mine = event_pools(fleet)
        now = {p.name: [e.url for e in p.endpoints] for p in pools}
        resolved = {p.name: now.get(p.name, []) for p in mine if p.resolve == "dns"}
        wanted = wanted_sources(mine, resolved)
        pool_of = {url: p for p in mine for url in p.kv_event_sources(resolved.get(p.name))}
        for url in list(self.subscribers.sources()):
            if url not in wanted:
                self.index.drop(url)
        await self.subscribers.sync(wanted, {url: pool_of[url].engine.value for url in wanted})
        for url in wanted:
            pool = pool_of[url]
            self.index.follow(url, list(pool.models), reload_ratio(pool))

    def start(self, fleet: Callable[[], Fleet], pools: Callable[[], Sequence[PoolSnapshot]]
              ) -> None:
        """Follow the fleet now and every ``interval_s`` seconds (until :meth:`aclose`)."""
        self._task = asyncio.get_running_loop().create_task(self._follow(fleet, pools),
                                                            name="kv-events follow")

    async def _follow(self, fleet: Callable[[], Fleet],
                      pools: Callable[[], Sequence[PoolSnapshot]]) -> None:
        while True:
            try:
                await self.follow_fleet(fleet(), pools())
            except (ValueError, OSError) as exc:  # a bad address, a socket that cannot open
                log.warning("KV events: cannot follow the fleet's engines: %s", exc)
            await asyncio.sleep(self._interval_s)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.subscribers.aclose()


def with_engine_events(fleet: Fleet, block_tokens: int,
                       state: RouterState) -> tuple[RouterState, EngineEvents | None]:
    """``state`` and no events for a fleet without ``kv_events``; else the state wrapped to
    match against the engines' events, and the events (not yet started)."""
    if not event_pools(fleet):
        return state, None
    index = KvEventIndex(block_tokens, index_blocks(fleet, block_tokens))
    log.info("KV events: precise prefix index for %s, up to %d blocks (~%.0f MB)",
             ", ".join(p.name for p in event_pools(fleet)), index.max_blocks,
             index.max_blocks * BYTES_PER_BLOCK / 1e6)
    return EventState(state, index), EngineEvents(index)


class KvEventGauges(Collector):
    """The index's size and the subscribers' counters, at scrape time."""

    def __init__(self, events: EngineEvents) -> None:
        self._events = events

    def collect(self) -> Iterator[Metric]:
        index = self._events.index
        yield GaugeMetricFamily("ridge_kv_event_index_blocks", "router blocks the engines "
                                "report holding (KV events), all endpoints", value=len(index))
        yield GaugeMetricFamily("ridge_kv_event_index_bytes", "their memory [B], estimated "
                                f"at {BYTES_PER_BLOCK} B per router block and "
                                f"{BYTES_PER_PAGE} B per engine page smaller than one",
                                value=index.memory_bytes())
        yield CounterMetricFamily("ridge_kv_event_index_dropped_blocks", "stored blocks the "
                                  "index did not keep (past its cap, or not matchable by "
                                  "tokens)", value=index.dropped)
        yield from _counters(self._events.subscribers.counters())


_COUNTERS: tuple[tuple[str, str, Callable[[KvEventCounters], int]], ...] = (
    ("ridge_kv_events_batches", "event batches applied", lambda c: c.batches_applied),
    ("ridge_kv_events", "events applied", lambda c: c.events_applied),
    ("ridge_kv_events_resets", "times the endpoint's blocks were forgotten (engine restart, "
     "events lost)", lambda c: c.resets),
    ("ridge_kv_events_replays", "replays asked of the engine", lambda c: c.replays),
    ("ridge_kv_events_decode_errors", "payloads that did not decode", lambda c: c.decode_errors),
)


def _counters(by_endpoint: dict[str, KvEventCounters]) -> Iterator[Metric]:
    for name, doc, read in _COUNTERS:
        family = CounterMetricFamily(name, doc, labels=("endpoint",))
        for url, counters in by_endpoint.items():
            family.add_metric((url,), read(counters))
        yield family
