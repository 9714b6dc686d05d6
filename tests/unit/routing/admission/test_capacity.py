"""Admission control's arithmetic, with worked numbers: capacity, full, budget, estimates."""

from __future__ import annotations

import math

import pytest

from routing.admission.capacity import (
    NOTHING,
    CapacityConfig,
    CapacityTracker,
    Ceiling,
    Limits,
    ReleaseRate,
    TtftFloor,
    expected_wait_s,
    full_endpoints,
    kv_requests,
    kv_tokens,
    likely_wait_s,
    next_ceiling,
    retry_after_s,
    wait_budget_s,
)
from routing.load import LoadCounts
from routing.snapshots import EndpointSnapshot, EngineMetrics, PoolSnapshot

CONFIG = CapacityConfig(ceiling_ttl_s=60.0, kv_full=0.9)


def engine(running: float, waiting: float, usage: float | None = None) -> EngineMetrics:
    return EngineMetrics(running=running, waiting=waiting, kv_cache_usage=usage)


def pools(*metrics: EngineMetrics) -> tuple[PoolSnapshot, ...]:
    endpoints = tuple(EndpointSnapshot(f"http://e{i}", "p", True, m)
                      for i, m in enumerate(metrics))
    return (PoolSnapshot("p", "vllm", "mixed", ("m",), endpoints),)


def test_kv_capacity_is_the_running_requests_scaled_to_the_target_share_of_the_cache() -> None:
    assert kv_requests(engine(10, 0, 0.5), 0.9) == 18  # 0.9 × 10 ÷ 0.5
    assert kv_requests(engine(15, 0, 0.95), 1.0) == 15  # ⌊15.79⌋
    assert kv_requests(engine(4, 0, 0.1), 0.9) == 36
    assert kv_requests(engine(0, 0, 0.0), 0.9) is None  # runs nothing: no per-request figure
    assert kv_requests(engine(3, 0, None), 0.9) is None


def test_kv_size_in_tokens_is_blocks_times_block_size() -> None:
    assert kv_tokens(EngineMetrics(kv_blocks_total=2500, kv_block_size=16)) == 40_000
    assert kv_tokens(EngineMetrics(kv_block_size=16)) is None
    assert kv_tokens(EngineMetrics(kv_capacity_tokens=442_353)) == 442_353  # SGLang: in tokens


def test_one_reading_with_a_queue_sets_no_ceiling_a_standing_one_with_a_full_cache_does() -> None:
    full = engine(16, 2, 0.95)
    assert next_ceiling(None, full, False, 0.0, CONFIG) is None  # may be a fresh arrival
    assert next_ceiling(None, full, True, 0.0, CONFIG) == Ceiling(16, 0.0)
    assert next_ceiling(None, engine(0, 3, 0.99), True, 0.0, CONFIG) == Ceiling(1, 0.0)


def test_a_queue_of_prompts_with_the_cache_half_empty_is_prefill_work_not_a_ceiling() -> None:
    assert next_ceiling(None, engine(10, 1, 0.57), True, 0.0, CONFIG) is None
    assert next_ceiling(None, engine(10, 1, None), True, 0.0, CONFIG) == Ceiling(10, 0.0)


def test_a_ceiling_rises_when_the_engine_runs_more_without_a_queue_and_expires() -> None:
    old = Ceiling(12, 0.0)
    assert next_ceiling(old, engine(14, 0, 0.8), False, 5.0, CONFIG) == Ceiling(14, 5.0)
    assert next_ceiling(old, engine(10, 0, 0.8), False, 5.0, CONFIG) is old
    assert next_ceiling(old, engine(10, 0, 0.8), False, 61.0, CONFIG) is None  # past the TTL
    assert next_ceiling(old, EngineMetrics(), True, 5.0, CONFIG) is old  # nothing reported


def test_full_endpoints_hold_their_capacity_in_flight() -> None:
    load = {"http://a": LoadCounts(15, 39_000), "http://b": LoadCounts(14, 36_000),
            "http://c": LoadCounts(3, 7_000)}
    assert full_endpoints(load, Limits({"http://a": 15, "http://b": 15})) == {"http://a"}
    # KV size alone: 40,000 tokens at 2,600 tokens per request → ⌊15.4⌋ = 15
    by_tokens = Limits({}, {"http://a": 40_000, "http://c": 40_000})
    assert full_endpoints(load, by_tokens) == {"http://a"}
    assert full_endpoints(load, Limits({}, {"http://a": 40_000}, allowance=1)) == NOTHING


def test_nothing_full_returns_the_shared_empty_set() -> None:
    assert full_endpoints({"http://a": LoadCounts(1, 10)}, Limits({"http://a": 5})) is NOTHING
    assert not Limits() and Limits({"http://a": 1}) and Limits({}, {"http://a": 1})


def test_the_book_learns_once_per_reading_and_keeps_the_smaller_capacity() -> None:
    tracker = CapacityTracker(CapacityConfig(kv_target=0.9), clock=lambda: 0.0)
    queued = engine(16, 1, 0.95)  # KV: 0.9 × 16 ÷ 0.95 → 15
    first = pools(queued)
    assert tracker.limits(first).at == {"http://e0": 15}
    assert tracker.limits(first) is tracker.limits(first)  # same snapshot: nothing recomputed
    assert tracker.ceiling("http://e0") is None
    tracker.limits(pools(queued))  # a new snapshot of the same reading: still one reading
    assert tracker.ceiling("http://e0") is None
    tracker.limits(pools(engine(12, 2, 0.95)))  # the second reading with a queue
    assert tracker.ceiling("http://e0") == Ceiling(12, 0.0)
    assert tracker.limits(pools(engine(12, 0, 0.5))).at == {"http://e0": 12}  # KV says 21
    assert tracker.pool_of("http://e0") == "p" and tracker.pool_of("http://x") is None


def test_the_book_forgets_endpoints_that_left_the_fleet() -> None:
    tracker = CapacityTracker(CapacityConfig(kv_target=0.9), clock=lambda: 0.0)
    for waiting in (2, 2):  # a standing queue on both: both learn a ceiling
        tracker.limits(pools(engine(12, waiting, 0.95), engine(12, waiting, 0.95)))
    assert tracker.ceiling("http://e1") == Ceiling(12, 0.0)
    tracker.limits(pools(engine(12, 0, 0.95)))  # e1 left the fleet
    assert tracker.ceiling("http://e1") is None and tracker.pool_of("http://e1") is None
    assert tracker.ceiling("http://e0") == Ceiling(12, 0.0)


def test_the_book_uses_the_kv_size_while_the_engine_runs_nothing() -> None:
    idle = EngineMetrics(running=0, waiting=0, kv_cache_usage=0.0, kv_blocks_total=2500,
                         kv_block_size=16)
    limits = CapacityTracker().limits(pools(idle, engine(0, 0)))
    assert limits.at == {} and limits.kv_tokens == {"http://e0": 40_000}
    sglang = EngineMetrics(running=0, waiting=0, kv_cache_usage=0.0, kv_capacity_tokens=40_000)
    limits = CapacityTracker().limits(pools(sglang))  # a cold SGLang engine has a capacity
    assert limits.kv_tokens == {"http://e0": 40_000}
    assert full_endpoints({"http://e0": LoadCounts(10, 40_000)}, limits) == {"http://e0"}


def test_the_book_adds_the_allowance() -> None:
    tracker = CapacityTracker(CapacityConfig(allowance=2, kv_target=1.0))
    assert tracker.limits(pools(engine(10, 0, 0.5))).at == {"http://e0": 22}


def test_idle_time_is_no_gap_between_releases() -> None:
    rate = ReleaseRate(weight=0.5)
    rate.release(0.0)
    rate.release(20.0)  # one gap of 20 s
    rate.resume(3620.0)  # held nothing for an hour, then a request again
    assert rate.per_s(3625.0) == pytest.approx(1 / 20)  # not 1 ÷ 3,625 s
    rate.resume(3600.0)  # never moves the last release back
    assert rate.last_at == 3620.0
    empty = ReleaseRate()
    empty.resume(5.0)
    assert empty.per_s(6.0) is None


def test_the_release_rate_is_the_inverse_mean_gap_slowed_by_silence() -> None:
    rate = ReleaseRate(weight=0.5)
    assert rate.per_s(0.0) is None
    rate.release(0.0)
    rate.release(0.5)  # one gap of 0.5 s
    assert rate.per_s(0.5) == pytest.approx(2.0)
    rate.release(1.5)  # gap 1.0: mean 0.5 + 0.5 × (1.0 − 0.5) = 0.75
    assert rate.per_s(1.5) == pytest.approx(1 / 0.75)
    assert rate.per_s(5.5) == pytest.approx(0.25)  # 4 s without a release


def test_after_a_single_release_the_time_since_it_is_the_gap() -> None:
    rate = ReleaseRate()
    rate.release(10.0)
    assert rate.per_s(14.0) == pytest.approx(0.25) and rate.mean_gap_s is None


def test_the_ttft_floor_is_mean_plus_two_mean_deviations() -> None:
    floor = TtftFloor(weight=0.5)
    assert floor.floor_s() == 0.0
    floor.observe(0.4)  # mean 0.4, deviation 0.2
    assert floor.floor_s() == pytest.approx(0.8)
    floor.observe(0.6)  # mean 0.5, deviation 0.2 + 0.5 × (0.2 − 0.2) = 0.2
    assert floor.mean_s == pytest.approx(0.5) and floor.floor_s() == pytest.approx(0.9)


@pytest.mark.parametrize(("slo", "floor", "max_wait", "budget"), [
    (1.0, 0.4, 10.0, 0.6), (None, 0.4, 10.0, 10.0), (1.0, 1.2, 10.0, 0.0), (30.0, 0.0, 10.0, 10.0),
])
def test_the_wait_budget(slo: float | None, floor: float, max_wait: float, budget: float) -> None:
    assert wait_budget_s(slo, floor, max_wait) == pytest.approx(budget)


def test_expected_wait_and_retry_after() -> None:
    assert expected_wait_s(3, 2.0) == 2.0  # four slots at two a second
    assert expected_wait_s(0, 4.0) == 0.25


def test_the_likely_wait_adds_deviations_of_a_poisson_stream_of_releases() -> None:
    # four slots at two a second: mean 2.0 s, standard deviation √4 ÷ 2 = 1.0 s
    assert likely_wait_s(3, 2.0, 2.0) == pytest.approx(4.0)
    assert likely_wait_s(3, 2.0, 0.0) == expected_wait_s(3, 2.0)
    # one slot at rate λ: 3 ÷ λ, which an exponential wait exceeds with probability e^-3
    assert likely_wait_s(0, 1.0, 2.0) == pytest.approx(3.0)
    assert math.exp(-3.0) == pytest.approx(0.0498, abs=1e-4)
    assert retry_after_s(3.2, 0.6) == 3
    assert retry_after_s(0.5, 0.6) == 1  # never below one second
    assert retry_after_s(None, 0.6) == 1
