"""The status document from two Prometheus pages a window apart: rates, attainment, windowed
quantiles as histogram_quantile gives them, the fleet's structure from the snapshot."""

from __future__ import annotations

import math

import pytest

from gateway.telemetry.status import PageSample, StatusHistory, quantile, sample, status, total
from routing.snapshots import EndpointSnapshot, EngineMetrics, PoolSnapshot

A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"


def page(requests: int, good: int, held: int, ttft: tuple[int, int, int], refused: int = 0,
         decided: int = 0) -> bytes:
    """A page of pool ``p``: ``ttft``'s counts at or below 0.1 s, 0.5 s and +Inf."""
    le_01, le_05, inf = ttft
    return f"""# TYPE ridge_requests_total counter
ridge_requests_total{{model="m",pool="p",status="200"}} {requests}
ridge_requests_total{{model="m",pool="p",status="503"}} {refused}
# TYPE ridge_goodput_requests_total counter
ridge_goodput_requests_total{{model="m",pool="p",lever="none",slo_class="default"}} {good}
# TYPE ridge_slo_evaluated_requests_total counter
ridge_slo_evaluated_requests_total{{model="m",pool="p",lever="none",slo_class="default"}} {held}
# TYPE ridge_admission_rejected_total counter
ridge_admission_rejected_total{{pool="p",reason="would_miss_slo"}} {refused}
ridge_admission_rejected_total{{pool="p",reason="queue_full"}} 0
# TYPE ridge_route_decisions_total counter
ridge_route_decisions_total{{pool="p",lever="prefix_cache",reason="prefix_heavy"}} {decided}
ridge_route_decisions_total_created{{pool="p",lever="prefix_cache",reason="prefix_heavy"}} 1.7e9
# TYPE ridge_time_to_first_token_seconds histogram
ridge_time_to_first_token_seconds_bucket{{model="m",pool="p",lever="none",le="0.1"}} {le_01}
ridge_time_to_first_token_seconds_bucket{{model="m",pool="p",lever="none",le="0.5"}} {le_05}
ridge_time_to_first_token_seconds_bucket{{model="m",pool="p",lever="none",le="+Inf"}} {inf}
ridge_time_to_first_token_seconds_count{{model="m",pool="p",lever="none"}} {inf}
ridge_time_to_first_token_seconds_sum{{model="m",pool="p",lever="none"}} 1.0
# TYPE ridge_pool_binding_wall gauge
ridge_pool_binding_wall{{pool="p",wall="compute"}} 0
ridge_pool_binding_wall{{pool="p",wall="kv_capacity"}} 1
# TYPE ridge_pool_mfu_ratio gauge
ridge_pool_mfu_ratio{{pool="p",source="ridge"}} 0.2
ridge_pool_mfu_ratio{{pool="p",source="engine"}} 0.3
# TYPE ridge_requests_in_flight gauge
ridge_requests_in_flight{{pool="p"}} 3
# TYPE ridge_endpoint_requests_in_flight gauge
ridge_endpoint_requests_in_flight{{pool="p",endpoint="{A}"}} 3
# TYPE ridge_endpoint_capacity_requests gauge
ridge_endpoint_capacity_requests{{pool="p",endpoint="{A}"}} 8
# TYPE ridge_engine_kv_cache_usage_ratio gauge
ridge_engine_kv_cache_usage_ratio{{pool="p",endpoint="{A}"}} 0.75
# TYPE ridge_engine_prefix_cache_queries_total counter
ridge_engine_prefix_cache_queries_total{{pool="p",endpoint="{A}"}} {100 * requests}
# TYPE ridge_engine_prefix_cache_hits_total counter
ridge_engine_prefix_cache_hits_total{{pool="p",endpoint="{A}"}} {40 * requests}
""".encode()


POOLS = (PoolSnapshot("p", "vllm", "mixed", ("m",), (
    EndpointSnapshot(A, "p", True, EngineMetrics(running=3.0)),
    EndpointSnapshot(B, "p", False, missing_levers=frozenset({"prefix_cache"})),
), levers=frozenset({"prefix_cache"})),)


def test_a_window_gives_rates_attainment_and_the_fleets_structure() -> None:
    old = sample(page(10, 8, 10, (5, 9, 10)), at=100.0)
    new = sample(page(30, 23, 30, (10, 25, 30), refused=4, decided=20), at=110.0)
    doc = status(new, old, POOLS, "1.2.3")
    pool = doc["pools"][0]
    assert doc["window_s"] == 10.0 and doc["version"] == "1.2.3" and doc["schema"] == 1
    assert pool["requests_per_s"] == pytest.approx((20 + 4) / 10)  # every status counted
    assert pool["goodput_per_s"] == pytest.approx(1.5)
    assert pool["slo_attainment"] == pytest.approx(15 / 20)
    assert pool["refused_per_s"] == pytest.approx(0.4) and pool["requests_total"] == 34
    assert pool["binding_wall"] == "kv_capacity" and pool["mfu"] == pytest.approx(0.3)
    assert (pool["healthy_endpoints"], pool["endpoints_total"], pool["in_flight"]) == (1, 2, 3)
    a, b = pool["endpoints"]
    assert (a["in_flight"], a["capacity"], a["kv_usage"]) == (3, 8, 0.75)
    assert a["prefix_hit_rate"] == pytest.approx(0.4)
    assert not b["healthy"] and b["levers_missing"] == ["prefix_cache"] and b["capacity"] is None
    # the window's 20 first tokens: 5 by 0.1 s, 11 more by 0.5 s, 4 above it
    assert pool["ttft_s"]["p50"] == pytest.approx(0.1 + 0.4 * (10 - 5) / 11)
    assert pool["ttft_s"]["p99"] == 0.5  # in the +Inf bucket: the highest finite bound
    assert pool["tpot_s"] == {"p50": None, "p99": None}
    assert doc["decisions"] == [{"pool": "p", "lever": "prefix_cache", "reason": "prefix_heavy",
                                 "total": 20.0, "per_s": 2.0}]
    assert doc["refusals"] == [{"pool": "p", "reason": "would_miss_slo", "total": 4.0,
                                "per_s": 0.4}]  # the series that counted nothing left out


def test_an_empty_window_has_no_rates_nor_quantiles() -> None:
    one = sample(page(10, 8, 10, (5, 9, 10)), at=100.0)
    pool = status(one, one, POOLS, "x")["pools"][0]
    assert pool["requests_per_s"] == 0 and pool["slo_attainment"] is None
    assert pool["ttft_s"] == {"p50": None, "p99": None} and pool["requests_total"] == 10


@pytest.mark.parametrize(("q", "buckets", "expected"), [
    (0.5, {0.1: 5.0, 0.5: 10.0, math.inf: 10.0}, 0.1),  # the rank on a bucket's bound
    (0.75, {0.1: 5.0, 0.5: 10.0, math.inf: 10.0}, 0.3),  # halfway into (0.1, 0.5]
    (0.25, {0.1: 4.0, math.inf: 4.0}, 0.025),  # from 0 in the first bucket
    (0.5, {0.1: 0.0, math.inf: 0.0}, None),
    (0.5, {}, None),
])
def test_quantiles_interpolate_within_a_bucket(q: float, buckets: dict[float, float],
                                               expected: float | None) -> None:
    assert quantile(q, buckets) == (pytest.approx(expected) if expected is not None else None)


def test_the_history_keeps_a_window_of_spaced_samples() -> None:
    history = StatusHistory(window_s=10.0, spacing_s=1.0)
    samples = [PageSample(t, {}) for t in (0.0, 0.4, 1.0, 5.0, 11.0, 12.5)]
    starts = [history.add(s)[0].at for s in samples]
    assert starts == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # 0.4 s too close; 0 s dropped at 11 s


def test_a_total_sums_the_labels_it_does_not_match_on() -> None:
    s = sample(page(10, 8, 10, (5, 9, 10), refused=2), at=0.0)
    assert total(s, "ridge_requests_total", pool="p") == {"": 12.0}
    assert total(s, "ridge_requests_total", by="status") == {"200": 10.0, "503": 2.0}
    assert total(s, "ridge_route_decisions_total_created") == {}
