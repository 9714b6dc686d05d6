"""The engines' own prefix-cache hit rate and request counts over a run, from their
``/metrics`` pages.

Each endpoint of the fleet file is scraped before and after the run and read with ridge's
engine dialects (:func:`backends.engines.dialects.dialect_for`,
:func:`backends.engines.scrape.normalise`), which give the same counters for both engines:
prompt tokens found in and looked up in the prefix cache, and finished requests. They come
from the engines, not from any router's headers, so they count the same behind any router.

Hit rate = Σ Δhits / Σ Δqueries over the endpoints (per pool and for the fleet); an endpoint
that cannot be scraped is left out and named in ``missing``; a counter a before-scrape lacks
counts as 0. See docs/benchmarks/router.md#the-engines-counters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from backends.engines.dialects import dialect_for
from backends.engines.scrape import MetricsParseError, normalise
from config.fleet import Fleet
from routing.snapshots import EngineMetrics

Scrape = Mapping[str, EngineMetrics]  # endpoint URL -> its metrics


@dataclass(frozen=True)
class CacheUse:
    """Tokens looked up in and served from the engines' prefix caches during a run — hits from
    the device and from a host-memory tier together (``EngineMetrics.host_cache_hits_total``)
    — and the requests the engines finished (None: no engine counted them)."""

    queries: float = 0.0
    hits: float = 0.0
    requests: float | None = None

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None


@dataclass(frozen=True)
class FleetCacheUse:
    """Per pool, per endpoint and for the whole fleet; ``missing``: endpoints left out. The
    per-endpoint queries (prompt tokens) also show how evenly the router spread the work;
    ``endpoint_pools``: each endpoint's pool."""

    total: CacheUse
    pools: Mapping[str, CacheUse]
    missing: tuple[str, ...] = field(default=())
    endpoints: Mapping[str, CacheUse] = field(default_factory=dict)
    endpoint_pools: Mapping[str, str] = field(default_factory=dict)

    @property
    def max_mean_requests(self) -> float | None:
        """Max/mean requests per replica (:func:`max_mean_requests`) over ``endpoints``."""
        return max_mean_requests(self.endpoints)


def max_mean_requests(endpoints: Mapping[str, CacheUse]) -> float | None:
    """Max ÷ mean of the requests each endpoint's engine finished (1.0 = perfectly even).

    Taken over every endpoint of the fleet that both scrapes covered and whose engine counts
    requests, whichever pool it is in: endpoints of pools the workload never reached count as
    0 requests, so a fleet whose unused pools hold most replicas shows a large figure. Endpoints
    left out of the scrapes (``missing``) are not in it. None without any such endpoint or
    without any request.
    """
    counts = [u.requests for u in endpoints.values() if u.requests is not None]
    if not counts or sum(counts) <= 0:
        return None
    return max(counts) / (sum(counts) / len(counts))


async def _scrape_one(session: aiohttp.ClientSession, url: str, engine: str
                      ) -> EngineMetrics | None:
    dialect = dialect_for(engine)
    try:
        async with session.get(url + dialect.metrics_path) as resp:
            if resp.status != 200:
                return None
            return normalise(await resp.text(), dialect)
    except (aiohttp.ClientError, TimeoutError, MetricsParseError):
        return None


async def scrape(fleet: Fleet, timeout_s: float = 5.0) -> dict[str, EngineMetrics]:
    """Every endpoint's metrics now (endpoints that fail are absent)."""
    targets = [(url, pool.engine.value) for pool in fleet.pools for url in pool.endpoint_urls()]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        found = await asyncio.gather(*(_scrape_one(session, u, e) for u, e in targets))
    return {url: m for (url, _), m in zip(targets, found, strict=True) if m is not None}


def _diff(a: float | None, b: float | None) -> float:
    """Counter increase from ``a`` to ``b``, a missing reading taken as 0, never negative."""
    return max(0.0, (b or 0.0) - (a or 0.0))


def _delta(before: EngineMetrics, after: EngineMetrics) -> CacheUse:
    requests = (None if after.requests_finished_total is None
                else _diff(before.requests_finished_total, after.requests_finished_total))
    hits = _diff(before.prefix_cache_hits_total, after.prefix_cache_hits_total) + \
        _diff(before.host_cache_hits_total, after.host_cache_hits_total)
    return CacheUse(_diff(before.prefix_cache_queries_total, after.prefix_cache_queries_total),
                    hits, requests)


def _add(a: CacheUse, b: CacheUse) -> CacheUse:
    """Sums; requests known on either side are added, None only if neither knows."""
    if a.requests is None or b.requests is None:
        requests = a.requests if b.requests is None else b.requests
    else:
        requests = a.requests + b.requests
    return CacheUse(a.queries + b.queries, a.hits + b.hits, requests)


def cache_use(fleet: Fleet, before: Scrape, after: Scrape) -> FleetCacheUse:
    """Hit rates over the run from two scrapes (module doc)."""
    total, pools, missing = CacheUse(), dict[str, CacheUse](), []
    endpoints: dict[str, CacheUse] = {}
    endpoint_pools: dict[str, str] = {}
    for pool in fleet.pools:
        for url in pool.endpoint_urls():
            if url not in before or url not in after:
                missing.append(url)
                continue
            use = endpoints[url] = _delta(before[url], after[url])
            endpoint_pools[url] = pool.name
            pools[pool.name] = _add(pools.get(pool.name, CacheUse()), use)
            total = _add(total, use)
    return FleetCacheUse(total, pools, tuple(missing), endpoints, endpoint_pools)
