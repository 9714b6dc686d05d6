"""The binding-wall rule and its arithmetic, on the worked numbers of the module docstring."""

from __future__ import annotations

import pytest

from routing.binding_wall import (
    COMPUTE,
    CONTENTION,
    KV_CAPACITY,
    MEMORY_BANDWIDTH,
    NO_WALL,
    WALLS,
    WallSignals,
    WallThresholds,
    binding_wall,
    capacity_tokens,
    kv_demand,
    lost_tokens,
)
from routing.formulas import ModelShape

LLAMA_3_8B = ModelShape(8.03e9, 32, 4096, 8, 128, 2.0)


def test_worked_numbers_lost_reuse_over_a_small_cache_is_the_capacity_wall() -> None:
    demand = kv_demand(1000, held_blocks=500, block_tokens=16, capacity=4096)
    assert demand.working_set == 8000 and demand.demand == 9000
    assert demand.ratio == pytest.approx(2.197, abs=1e-3)
    s = WallSignals(predicted_tokens=6000, lost_tokens=4500, kv_demand_ratio=demand.ratio,
                    mfu=0.62, mbu=0.3)
    assert s.lost_ratio() == 0.75
    assert binding_wall(s) == KV_CAPACITY  # capacity first, though MFU is high


def test_worked_numbers_compute_bandwidth_and_contention() -> None:
    assert binding_wall(WallSignals(6000, 100, mfu=0.62, mbu=0.30)) == COMPUTE
    assert binding_wall(WallSignals(mfu=0.55, mbu=0.60)) == MEMORY_BANDWIDTH
    assert binding_wall(WallSignals(mfu=0.10, mbu=0.71)) == MEMORY_BANDWIDTH
    contended = WallSignals(mfu=0.2, mbu=0.3, prefill_tokens=3000, decode_tokens=1000,
                            evaluated=20, tpot_violations=3)
    assert contended.prefill_share() == 0.75 and contended.tpot_violation_ratio() == 0.15
    assert binding_wall(contended) == CONTENTION
    assert binding_wall(WallSignals(6000, 100, mfu=0.1, mbu=0.2)) == NO_WALL
    assert binding_wall(WallSignals()) == NO_WALL  # nothing measured: no wall shows


def test_lost_reuse_needs_volume_and_a_plausible_demand() -> None:
    # 500 predicted tokens are too few to judge, whatever their loss
    assert WallSignals(500, 500).lost_ratio() is None
    assert binding_wall(WallSignals(500, 500)) == NO_WALL
    # the engines had room for the working set twice over: a misprediction, not eviction
    assert binding_wall(WallSignals(6000, 3000, kv_demand_ratio=0.4)) == NO_WALL
    assert binding_wall(WallSignals(6000, 3000, kv_demand_ratio=0.5)) == KV_CAPACITY
    assert binding_wall(WallSignals(6000, 3000)) == KV_CAPACITY  # capacity unknown
    # below the 0.2 threshold, above it
    assert binding_wall(WallSignals(6000, 1100)) == NO_WALL
    assert binding_wall(WallSignals(6000, 1200)) == KV_CAPACITY


def test_a_full_cache_binds_only_when_it_preempts_or_cannot_hold_the_demand() -> None:
    assert binding_wall(WallSignals(kv_usage=0.95, kv_demand_ratio=0.8)) == NO_WALL
    assert binding_wall(WallSignals(kv_usage=0.95, preemptions=3)) == KV_CAPACITY
    assert binding_wall(WallSignals(kv_usage=0.95, kv_demand_ratio=1.3)) == KV_CAPACITY
    assert binding_wall(WallSignals(kv_usage=0.85, preemptions=3,
                                    kv_demand_ratio=1.3)) == NO_WALL
    assert binding_wall(WallSignals(kv_usage=0.95, preemptions=0)) == NO_WALL


def test_contention_needs_enough_requests_and_a_prefill_mix() -> None:
    few = WallSignals(prefill_tokens=3000, decode_tokens=1000, evaluated=5, tpot_violations=3)
    assert few.tpot_violation_ratio() is None and binding_wall(few) == NO_WALL
    decode_only = WallSignals(prefill_tokens=100, decode_tokens=9900, evaluated=20,
                              tpot_violations=10)
    assert binding_wall(decode_only) == NO_WALL
    assert WallSignals().prefill_share() is None


def test_thresholds_are_parameters() -> None:
    strict = WallThresholds(lost_ratio=0.5, busy=0.9)
    assert binding_wall(WallSignals(6000, 1200), strict) == NO_WALL
    assert binding_wall(WallSignals(mfu=0.62), strict) == NO_WALL
    assert set(WALLS) == {KV_CAPACITY, COMPUTE, MEMORY_BANDWIDTH, CONTENTION, NO_WALL}


def test_lost_tokens_per_request() -> None:
    assert lost_tokens(1024, 1024, 2000) == (1024, 0)      # all there
    assert lost_tokens(1024, 256, 2000) == (1024, 768)     # evicted in part
    assert lost_tokens(1024, 2000, 3000) == (1024, 0)      # the engine held more
    assert lost_tokens(1024, 0, 1024) == (1023, 1023)      # at most P − 1 can be cached
    assert lost_tokens(1024, 0, None) == (1024, 1024)      # prompt length unknown
    assert lost_tokens(0, 0, 50) == (0, 0)


def test_capacity_from_bytes_uses_the_kv_bytes_per_token_formula() -> None:
    assert LLAMA_3_8B.kv_bytes_per_token == 131_072  # 2 · 32 · 8 · 128 · 2
    assert capacity_tokens(6e9, LLAMA_3_8B) == 45_776
    fp8 = ModelShape(8.03e9, 32, 4096, 8, 128, 2.0, kv_dtype_bytes=1.0)
    assert capacity_tokens(6e9, fp8) == 91_552  # an 8-bit KV cache holds twice the tokens


def test_kv_demand_sums_in_flight_and_working_set() -> None:
    d = kv_demand(1500, held_blocks=100, block_tokens=16, capacity=None)
    assert (d.in_flight, d.working_set, d.demand, d.ratio) == (1500, 1600, 3100, None)
    assert kv_demand(0, 0, 16, capacity=0).ratio is None
