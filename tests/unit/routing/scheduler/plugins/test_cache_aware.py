"""Worked numbers: a 1000-token prompt in 10 blocks of 100 tokens.

cost = max(1000 − matched × 100, 1) × (load ÷ load_scale + 1); score = min cost / cost. The
table is worked with ``load_scale`` 1 (every request in flight one queued request, LMetric's
cost); the default's own cases follow it.
"""

from __future__ import annotations

import pytest

from routing.scheduler.plugins.cache_aware import CacheAware, cost
from routing.snapshots import EndpointSnapshot
from tests.unit.routing.scheduler.snapshots import by_url, ctx, ep, features, view


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
    assert by_url(CacheAware(load_scale=1.0), c, endpoints) == pytest.approx(expected)


def test_the_default_load_scale_counts_two_requests_in_flight_as_one_queued() -> None:
    # a holds 8 blocks with load 5: 200 × (5 ÷ 2 + 1) = 700 beats idle b at 1000 × 1
    endpoints = [ep("a"), ep("b")]
    c = ctx(endpoints, features(prompt_tokens=1000), view(matched={"a": 8}, load={"a": 5}))
    assert by_url(CacheAware(), c, endpoints) == pytest.approx({"a": 1.0, "b": 0.7})
    # ... not with load 9: 200 × 5.5 = 1100 > 1000
    c = ctx(endpoints, features(prompt_tokens=1000), view(matched={"a": 8}, load={"a": 9}))
    assert by_url(CacheAware(), c, endpoints) == pytest.approx({"a": 1000 / 1100, "b": 1.0})


def test_a_follow_up_stays_on_its_history_beside_an_idle_replica() -> None:
    """A turn of the capacity benchmark's trace: 8,749 prompt tokens, 8,100 of them its
    history on a replica with 12 requests in flight; another replica idle holds only the
    2,048-token system prompt (blocks of 100 tokens here: 81 and 20)."""
    endpoints = [ep("home"), ep("idle")]
    c = ctx(endpoints, features(prompt_tokens=8749),
            view(matched={"home": 81, "idle": 20}, load={"home": 12}))
    # 649 × (12 ÷ 2 + 1) = 4,543 against 6,749 × 1: it stays
    assert by_url(CacheAware(), c, endpoints) == pytest.approx({"home": 1.0, "idle": 4543 / 6749})
    # counting each request in flight as a queued one, 649 × 13 = 8,437: it would move
    assert by_url(CacheAware(load_scale=1.0), c, endpoints) == pytest.approx(
        {"home": 6749 / 8437, "idle": 1.0})


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_load_scale_must_be_a_positive_number(bad: float) -> None:
    with pytest.raises(ValueError, match="load_scale"):
        CacheAware(load_scale=bad)


def test_empty_prompt_reduces_to_least_load() -> None:
    endpoints = [ep("a"), ep("b")]
    c = ctx(endpoints, features(prompt_tokens=0), view(load={"a": 1}))
    assert by_url(CacheAware(), c, endpoints) == pytest.approx({"a": 2 / 3, "b": 1.0})


def test_cost_units() -> None:
    # 350 tokens, blocks of 100, 2 matched → 150 uncached; load max(router 4, engine 2)
    # = 4 → × (4 ÷ 2 + 1)
    e = ep("a", running=2)
    c = ctx([e], features(prompt_tokens=350), view(matched={"a": 2}, load={"a": 4}))
    assert cost(c, e) == 150 * 3
