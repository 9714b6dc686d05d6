"""Worked numbers: a 1000-token prompt in 10 blocks of 100 tokens.

cost = max(1000 − matched × 100, 1) × (load + 1); score = min cost / cost.
"""

from __future__ import annotations

import pytest

from routing.scheduler.plugins.cache_aware import CacheAware, cost
from routing.snapshots import EndpointSnapshot
from tests.unit.routing.scheduler.snapshots import ctx, ep, features, view


@pytest.mark.parametrize(
    ("endpoints", "matched", "load", "expected"),
    [
        # no cache anywhere: costs 1000, 2000, 4000 → pure least load
        ([ep("a"), ep("b"), ep("c")], {}, {"b": 1, "c": 3}, {"a": 1.0, "b": 0.5, "c": 0.25}),
        # a holds 8 blocks with load 3: 200 × 4 = 800 beats idle b at 1000 × 1
        ([ep("a"), ep("b")], {"a": 8}, {"a": 3}, {"a": 1.0, "b": 0.8}),
        # ... but not with load 5: 200 × 6 = 1200 > 1000
        ([ep("a"), ep("b")], {"a": 8}, {"a": 5}, {"a": 1000 / 1200, "b": 1.0}),
        # the engine's running + waiting is the load when it exceeds the router's count (the
        # same requests seen twice, not added): 200 × (max(1, 2 + 3) + 1) = 1200
        ([ep("a", running=2, waiting=3), ep("b")], {"a": 8}, {"a": 1},
         {"a": 1000 / 1200, "b": 1.0}),
        # ... and the router's count when it is larger: 200 × (max(5, 1 + 1) + 1) = 1200
        ([ep("a", running=1, waiting=1), ep("b")], {"a": 8}, {"a": 5},
         {"a": 1000 / 1200, "b": 1.0}),
        # the whole prompt cached on both: uncached floors at 1, load still decides (1 vs 5)
        ([ep("a"), ep("b")], {"a": 10, "b": 10}, {"b": 4}, {"a": 1.0, "b": 0.2}),
        # a stale match longer than the prompt is capped, never negative work
        ([ep("a"), ep("b")], {"a": 50}, {}, {"a": 1.0, "b": 0.001}),
        ([], {}, {}, {}),
    ],
)
def test_scores(endpoints: list[EndpointSnapshot], matched: dict[str, int],
                load: dict[str, int], expected: dict[str, float]) -> None:
    c = ctx(endpoints, features(prompt_tokens=1000), view(matched=matched, load=load))
    assert CacheAware().score(c, endpoints) == pytest.approx(expected)


def test_empty_prompt_reduces_to_least_load() -> None:
    endpoints = [ep("a"), ep("b")]
    c = ctx(endpoints, features(prompt_tokens=0), view(load={"a": 1}))
    assert CacheAware().score(c, endpoints) == pytest.approx({"a": 0.5, "b": 1.0})


def test_cost_units() -> None:
    # 350 tokens, blocks of 100, 2 matched → 150 uncached; load max(router 3, engine 2)
    # = 3 → × 4
    e = ep("a", running=2)
    c = ctx([e], features(prompt_tokens=350), view(matched={"a": 2}, load={"a": 3}))
    assert cost(c, e) == 150 * 4
