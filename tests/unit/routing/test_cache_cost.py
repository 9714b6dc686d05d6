from __future__ import annotations

from routing.cache_cost import (
    LOAD_SCALE,
    best_match,
    cache_cost,
    matched_blocks,
    uncached_tokens,
)
from tests.unit.routing.scheduler.snapshots import ep, features, view


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


def test_cache_cost_is_uncached_tokens_times_load_over_scale_plus_one() -> None:
    f = features(prompt_tokens=1000)
    # 3 blocks held: 700 uncached; load max(router 2, engine 1) = 2 → 700 × (2 ÷ 2 + 1)
    assert LOAD_SCALE == 2.0
    assert cache_cost(ep("a", running=1), f, view(matched={"a": 3}, load={"a": 2})) == 1400
    # every request in flight counted as one queued request: 700 × (2 + 1)
    assert cache_cost(ep("a", running=1), f, view(matched={"a": 3}, load={"a": 2}),
                      load_scale=1.0) == 2100
    # the whole prompt held: floored at 1 token, so idle endpoints are told apart by load
    assert cache_cost(ep("b"), f, view(matched={"b": 10})) == 1
    assert cache_cost(ep("b"), f, view(matched={"b": 10}, load={"b": 4})) == 3


def test_blocks_held_only_in_a_host_tier_cost_a_reload() -> None:
    """Cheaper than recomputing them, dearer than holding them on the device."""
    f = features(prompt_tokens=1000)
    device = view(matched={"a": 8})
    host = device.replaced(reload_tokens={"a": 400 * 0.25})  # 4 of the 8 only in the host tier
    on_device, reloaded = cache_cost(ep("a"), f, device), cache_cost(ep("a"), f, host)
    recomputed = cache_cost(ep("a"), f, view(matched={"a": 4}))
    assert (on_device, reloaded, recomputed) == (200, 300, 600)
