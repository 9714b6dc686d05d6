"""Merging the workers' /metrics pages sample by sample."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.workers.merged_metrics import merge

ONE = """# HELP ridge_requests_total Requests finished
# TYPE ridge_requests_total counter
ridge_requests_total{model="m",pool="p",status="200"} 3.0
ridge_requests_created{model="m",pool="p",status="200"} 100.0
# HELP ridge_request_duration_seconds End-to-end request latency
# TYPE ridge_request_duration_seconds histogram
ridge_request_duration_seconds_bucket{le="0.1",pool="p"} 2.0
ridge_request_duration_seconds_bucket{le="+Inf",pool="p"} 3.0
ridge_request_duration_seconds_count{pool="p"} 3.0
ridge_request_duration_seconds_sum{pool="p"} 0.4
# HELP ridge_requests_in_flight This gateway's requests being served now, by pool
# TYPE ridge_requests_in_flight gauge
ridge_requests_in_flight{pool="p"} 2.0
# HELP ridge_endpoint_up 1 when up
# TYPE ridge_endpoint_up gauge
ridge_endpoint_up{endpoint="e",pool="p"} 0.0
# HELP ridge_mfu_ratio MFU
# TYPE ridge_mfu_ratio gauge
ridge_mfu_ratio{endpoint="e",pool="p",source="ridge"} 0.1
ridge_mfu_ratio{endpoint="e",pool="p",source="engine"} 0.3
# HELP ridge_estimated_flops_total FLOPs
# TYPE ridge_estimated_flops_total counter
ridge_estimated_flops_total{endpoint="e",pool="p",source="engine"} 1000.0
# HELP ridge_state_backend_up Redis
# TYPE ridge_state_backend_up gauge
ridge_state_backend_up{backend="redis"} 1.0
"""
TWO = ONE.replace('status="200"} 3.0', 'status="200"} 4.0').replace(
    'ridge_requests_created{model="m",pool="p",status="200"} 100.0',
    'ridge_requests_created{model="m",pool="p",status="200"} 90.0').replace(
    'ridge_endpoint_up{endpoint="e",pool="p"} 0.0', 'ridge_endpoint_up{endpoint="e",pool="p"} 1.0'
).replace('source="ridge"} 0.1', 'source="ridge"} 0.2').replace(
    'source="engine"} 1000.0', 'source="engine"} 1200.0').replace(
    'ridge_state_backend_up{backend="redis"} 1.0', 'ridge_state_backend_up{backend="redis"} 0.0')


def samples(page: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(page.decode())
            for s in family.samples}


def value(page: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    return page[(name, frozenset(labels.items()))]


def test_counters_and_histograms_add_up_and_created_is_the_earliest() -> None:
    got = samples(merge([ONE, TWO]))
    assert value(got, "ridge_requests_total", model="m", pool="p", status="200") == 7
    assert value(got, "ridge_requests_created", model="m", pool="p", status="200") == 90
    assert value(got, "ridge_request_duration_seconds_bucket", le="0.1", pool="p") == 4
    assert value(got, "ridge_request_duration_seconds_sum", pool="p") == 0.8


def test_gauges_follow_their_rule() -> None:
    got = samples(merge([ONE, TWO]))
    assert value(got, "ridge_requests_in_flight", pool="p") == 4  # each worker's own: summed
    assert value(got, "ridge_endpoint_up", endpoint="e", pool="p") == 1  # the same: largest
    assert value(got, "ridge_mfu_ratio", endpoint="e", pool="p", source="ridge") == 0.1 + 0.2
    assert value(got, "ridge_mfu_ratio", endpoint="e", pool="p", source="engine") == 0.3
    assert value(got, "ridge_estimated_flops_total", endpoint="e", pool="p",
                 source="engine") == 1200  # the same engine counter read twice: not added
    assert value(got, "ridge_state_backend_up", backend="redis") == 0  # any worker down


def test_one_page_merges_into_itself() -> None:
    assert samples(merge([ONE])) == samples(ONE.encode())
