from __future__ import annotations

import math

import pytest

from routing.measures import (
    best_match,
    endpoint_load,
    matched_blocks,
    pool_load,
    pool_saturated,
    uncached_tokens,
)
from routing.types import EndpointSnapshot, PoolSnapshot
from tests.unit.routing.scheduler.snapshots import ep, features, view


@pytest.mark.parametrize(
    ("endpoint", "shared", "load"),
    [
        (ep("a"), {}, 0),
        (ep("a", in_flight=2, running=3, waiting=1), {}, 4),  # the engine's count, not a sum
        (ep("a", in_flight=5, running=3, waiting=1), {}, 5),  # the gateway's (engine behind)
        (ep("a", in_flight=1, running=1), {"a": 3}, 3),
        (ep("a", in_flight=2), {"a": 5}, 5),  # shared count covers the local one
        (ep("a", in_flight=4), {"a": 1}, 4),  # shared state behind: local count still counts
    ],
)
def test_endpoint_load(endpoint: EndpointSnapshot, shared: dict[str, int], load: float) -> None:
    assert endpoint_load(endpoint, view(load=shared)) == load


def _pool(*endpoints: EndpointSnapshot) -> PoolSnapshot:
    return PoolSnapshot("p", "vllm", "mixed", ("m",), endpoints)


def test_pool_load_is_the_mean_over_healthy_endpoints() -> None:
    pool = _pool(ep("a", in_flight=2), ep("b", in_flight=4), ep("c", in_flight=99, healthy=False))
    assert pool_load(pool, view()) == 3
    assert pool_load(_pool(ep("a", healthy=False)), view()) == math.inf


def test_matches_are_capped_and_uncached_tokens_never_negative() -> None:
    f = features(prompt_tokens=1000)  # 10 blocks of 100 tokens
    state = view(matched={"a": 3, "b": 40})
    assert matched_blocks("a", f, state) == 3
    assert matched_blocks("b", f, state) == 10
    assert matched_blocks("zzz", f, state) == 0
    assert best_match([ep("a"), ep("b")], f, state) == 10
    assert best_match([], f, state) == 0
    assert uncached_tokens(f, 3) == 700
    assert uncached_tokens(f, 12) == 0


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
