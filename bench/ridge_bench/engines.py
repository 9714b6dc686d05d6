"""The engines' own prefix-cache hit rate over a run, from their ``/metrics`` pages.

Each endpoint of the fleet file is scraped before and after the run and read with ridge's
engine dialects (:func:`backends.dialects.dialect_for`, :func:`backends.metrics.normalise`),
which give the same two counters for both engines, in tokens:

- vLLM: ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``;
- SGLang: ``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total`` (every prompt token
  is looked up in the radix cache).

Hit rate = Σ Δhits / Σ Δqueries over the endpoints (per pool and for the whole fleet). An
endpoint that cannot be scraped (either time) is left out and named in ``missing``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from backends.dialects import dialect_for
from backends.fleet_file import Fleet
from backends.metrics import MetricsParseError, normalise
from routing.snapshots import EngineMetrics

Scrape = Mapping[str, EngineMetrics]  # endpoint URL -> its metrics


@dataclass(frozen=True)
class CacheUse:
    """Tokens looked up in and served from the engines' prefix caches during a run."""

    queries: float = 0.0
    hits: float = 0.0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None


@dataclass(frozen=True)
class FleetCacheUse:
    """Per pool, per endpoint and for the whole fleet; ``missing``: endpoints left out. The
    per-endpoint queries (prompt tokens) also show how evenly the router spread the work."""

    total: CacheUse
    pools: Mapping[str, CacheUse]
    missing: tuple[str, ...] = field(default=())
    endpoints: Mapping[str, CacheUse] = field(default_factory=dict)


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


def _delta(before: EngineMetrics, after: EngineMetrics) -> CacheUse:
    def diff(a: float | None, b: float | None) -> float:
        return max(0.0, (b or 0.0) - (a or 0.0))

    return CacheUse(diff(before.prefix_cache_queries_total, after.prefix_cache_queries_total),
                    diff(before.prefix_cache_hits_total, after.prefix_cache_hits_total))


def _add(a: CacheUse, b: CacheUse) -> CacheUse:
    return CacheUse(a.queries + b.queries, a.hits + b.hits)


def cache_use(fleet: Fleet, before: Scrape, after: Scrape) -> FleetCacheUse:
    """Hit rates over the run from two scrapes (module doc)."""
    total, pools, missing = CacheUse(), dict[str, CacheUse](), []
    endpoints: dict[str, CacheUse] = {}
    for pool in fleet.pools:
        for url in pool.endpoint_urls():
            if url not in before or url not in after:
                missing.append(url)
                continue
            use = endpoints[url] = _delta(before[url], after[url])
            pools[pool.name] = _add(pools.get(pool.name, CacheUse()), use)
            total = _add(total, use)
    return FleetCacheUse(total, pools, tuple(missing), endpoints)
