"""gateway.plan.score: goodput, percentiles, hit rate, MFU/MBU and cost, on worked numbers."""

from __future__ import annotations

import math

import pytest

from config.fleet import parse_fleet
from gateway.plan.evaluate import Evaluation, PoolCounters, Served
from gateway.plan.score import percentile, score
from gateway.plan.space import Brief, Part, candidate, fleet_document
from routing.formulas import Bounds

L4 = Brief("llama-3-8b", "nvidia-l4")  # 121 TFLOP/s, 300 GB/s


def _served(i: int, ttft: float | None, tpot: float | None, pool: str = "general",
            status: int = 200) -> Served:
    return Served(i, status, pool, 1000, 100 if ttft is not None else 0, ttft, tpot, 10.0)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0 and math.isnan(percentile([], 0.5))


def test_a_score_on_worked_numbers() -> None:
    fleet = parse_fleet(fleet_document(candidate(Part("general", 2)), L4))
    served = (_served(0, 0.5, 0.02), _served(1, 3.0, 0.02),  # TTFT over the bound
              _served(2, 0.4, 0.09),  # TPOT over
              _served(3, None, None, "", 503))  # refused
    ev = Evaluation(served, {"general": PoolCounters(4000, 1000, 121e12 * 20, 300e9 * 10)},
                    span_s=20.0, window_s=10.0, walls={"general": {"compute": 3, "none": 1}})
    s = score(ev, fleet, Bounds(ttft_s=2.0, tpot_s=0.05), price_per_gpu_hour=3.6)
    assert (s.requests, s.answered, s.good) == (4, 3, 1)
    assert s.goodput == pytest.approx(1 / 10.0)  # one good request over the 10 s window
    assert s.goodput_per_gpu == pytest.approx(0.05)
    assert (s.ttft_p50, s.ttft_p99) == (0.5, 3.0)
    assert s.hit_rate == pytest.approx(0.25)
    assert s.mfu == pytest.approx(0.5)  # 121e12 × 20 FLOP over 20 s × 2 GPUs × 121e12
    assert s.mbu == pytest.approx(0.25)
    # 2 GPUs × 20 s = 1/90 GPU-hour at $3.6 = $0.04, for 100 good tokens = 1e-4 Mtok
    assert s.cost_per_mtok == pytest.approx(400.0)
    (pool,) = s.pools
    assert (pool.engines, pool.share, pool.wall) == (2, 0.75, "compute")


def test_a_decode_pool_takes_its_prefill_pools_share_and_no_hits() -> None:
    fleet = parse_fleet(fleet_document(candidate(Part("pd", 1, 1)), L4))
    ev = Evaluation((_served(0, 0.5, 0.02, "pd-prefill"),),
                    {"pd-prefill": PoolCounters(100, 50, 0.0, 0.0),
                     "pd-decode": PoolCounters(100, 100, 0.0, 0.0)},
                    span_s=5.0, window_s=0.0, walls={})
    s = score(ev, fleet, Bounds(), 1.0)
    assert [(p.name, p.share, p.wall) for p in s.pools] == [("pd-prefill", 1.0, "-"),
                                                            ("pd-decode", 1.0, "-")]
    assert s.hit_rate == 0.5  # the decode pool receives its KV: not counted
    assert s.goodput == pytest.approx(1 / 5.0)  # a trace of one instant: over the span
