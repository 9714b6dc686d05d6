from __future__ import annotations

import math

import pytest

from routing.load import (
    LoadCounts,
    PoolLoad,
    endpoint_load,
    pool_load,
    pool_saturated,
    pool_summary,
    request_tokens,
    taken_since,
)
from routing.snapshots import EndpointSnapshot, EngineMetrics, PoolSnapshot


def ep(url: str, running: float | None = None, waiting: float | None = None,
       kv: float | None = None, healthy: bool = True) -> EndpointSnapshot:
    return EndpointSnapshot(url, "p", healthy,
                            EngineMetrics(running=running, waiting=waiting, kv_cache_usage=kv))


def _pool(*endpoints: EndpointSnapshot) -> PoolSnapshot:
    return PoolSnapshot("p", "vllm", "mixed", ("m",), endpoints)


def test_a_request_reserves_its_prompt_and_expected_output() -> None:
    assert request_tokens(1200, 256) == 1456
    assert request_tokens(0, 0) == 0
    assert request_tokens(-5, 2) == 0  # never negative


@pytest.mark.parametrize(
    ("endpoint", "counted", "load"),
    [
        (ep("a"), {}, 0),
        (ep("a", running=3, waiting=1), {"a": 2}, 4),  # the engine's count, not a sum
        (ep("a", running=3, waiting=1), {"a": 5}, 5),  # the router's (engine behind a poll)
        (ep("a", running=1), {"a": 3}, 3),
        (ep("a", running=6, waiting=2), {"b": 9}, 8),  # clients bypassing the gateway
    ],
)
def test_endpoint_load_counts_each_request_once(endpoint: EndpointSnapshot,
                                                counted: dict[str, int], load: float) -> None:
    in_flight = {url: LoadCounts(n, 10 * n) for url, n in counted.items()}
    assert endpoint_load(endpoint, in_flight) == load


def test_pool_load_is_the_mean_over_healthy_endpoints() -> None:
    pool = _pool(ep("a"), ep("b"), ep("c", healthy=False))
    counts = {"a": LoadCounts(2), "b": LoadCounts(4), "c": LoadCounts(99)}
    assert pool_load(pool, counts) == 3
    assert pool_load(_pool(ep("a", healthy=False)), {}) == math.inf


@pytest.mark.parametrize(
    ("waiting", "healthy", "saturated"),
    [
        ([8, 9], [True, True], True),
        ([8, 7], [True, True], False),
        ([8, 0], [True, False], True),  # only healthy endpoints count
        ([None, None], [True, True], False),
        ([9], [False], False),  # unhealthy, not saturated
    ],
)
def test_pool_saturated(waiting: list[float | None], healthy: list[bool], saturated: bool) -> None:
    pool = _pool(*(ep(str(i), waiting=w, healthy=h)
                   for i, (w, h) in enumerate(zip(waiting, healthy, strict=True))))
    assert pool_saturated(pool, 8) is saturated


POOL = PoolSnapshot("gen", "vllm", "mixed", ("m",), (
    ep("a", running=2, waiting=0, kv=0.30),
    ep("b", running=5, waiting=3, kv=0.85),
    ep("c", running=9, waiting=9, kv=0.99, healthy=False),
    ep("d"),
))
COUNTS = {"a": LoadCounts(3, 1200), "b": LoadCounts(1, 800), "c": LoadCounts(9, 9000)}


@pytest.mark.parametrize(
    ("pool", "counts", "expected"),
    [
        # healthy a, b, d: requests 3+1+0, tokens 1200+800, running 2+5, waiting 0+3,
        # load max(3, 2) + max(1, 8) + 0 = 11; c is unhealthy and left out
        (POOL, COUNTS, PoolLoad("gen", 4, 2000, 7.0, 3.0, 0.85, 3, 4, 11.0)),
        (POOL, {}, PoolLoad("gen", 0, 0, 7.0, 3.0, 0.85, 3, 4, 10.0)),
        (PoolSnapshot("empty", "sglang", "mixed", ("m",), ()), COUNTS,
         PoolLoad("empty", 0, 0, 0.0, 0.0, None, 0, 0, 0.0)),
        (PoolSnapshot("down", "vllm", "mixed", ("m",), (ep("c", 9, healthy=False),)), COUNTS,
         PoolLoad("down", 0, 0, 0.0, 0.0, None, 0, 1, 0.0)),
    ],
)
def test_pool_summary_sums_the_healthy_endpoints(pool: PoolSnapshot, counts: dict[str, LoadCounts],
                                                 expected: PoolLoad) -> None:
    assert pool_summary(pool, counts) == expected


def test_the_summary_load_is_the_policys_load() -> None:
    assert pool_summary(POOL, COUNTS).load == pytest.approx(3 * pool_load(POOL, COUNTS))


@pytest.mark.parametrize(("load", "expected"), [
    (PoolLoad("p", 4, 2000, 0, 0, None, 4, 4, 4), 500.0),
    (PoolLoad("p", 4, 2000, 0, 0, None, 0, 4, 4), 0.0),
])
def test_tokens_per_endpoint(load: PoolLoad, expected: float) -> None:
    assert load.tokens_per_endpoint == expected


@pytest.mark.parametrize(
    ("seen", "now", "picks", "taken"),
    [
        ({"a": 0, "b": 0}, {"a": 0, "b": 0}, ["a"], False),  # nothing changed
        ({"a": 0, "b": 0}, {"a": 1, "b": 0}, ["a"], True),  # someone took a meanwhile
        ({"a": 0, "b": 0}, {"a": 1, "b": 0}, ["b"], False),  # ... b is still a fair choice
        ({"a": 0, "b": 0}, {"a": 1, "b": 1}, ["a"], False),  # every endpoint got busier evenly
        ({"a": 2, "b": 2}, {"a": 3, "b": 1}, ["a"], True),  # a gained while b lost
        ({"a": 2, "b": 2}, {"a": 2, "b": 0}, ["a"], False),  # a gained nothing
        ({"a": 0, "b": 0}, {"b": 2}, ["a"], False),  # missing now = 0
        ({"p": 0, "d": 0, "x": 0}, {"p": 0, "d": 1, "x": 0}, ["p", "d"], True),  # a pair's side
        ({}, {"a": 1}, ["a"], True),  # no candidates seen: any gain is a take
    ],
)
def test_taken_since_refuses_a_pick_that_gained_more_than_the_least(
        seen: dict[str, int], now: dict[str, int], picks: list[str], taken: bool) -> None:
    assert taken_since(seen, now, picks) is taken
