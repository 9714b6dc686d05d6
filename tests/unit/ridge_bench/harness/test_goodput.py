"""Goodput, TPOT, percentiles and shares on worked numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ridge_bench.harness.goodput import (
    RequestResult,
    Slo,
    meets,
    percentile,
    shares,
    step_windows,
    summarise,
    write_records,
)
from ridge_bench.harness.route import Route

SLO = Slo(ttft_s=2.0, tpot_s=0.1, e2e_s=30.0)


def ok(ttft: float, e2e: float, tokens: int, pool: str = "p", step: int = 0) -> RequestResult:
    return RequestResult("agent", step, 0.0, None, ttft, e2e, tokens, route=Route(pool=pool))


def failed(error: str = "HTTP 503") -> RequestResult:
    return RequestResult("agent", 0, 0.0, error)


def test_tpot_is_decode_time_per_token_after_the_first() -> None:
    # 0.5 s to the first token, 10.4 s in all, 100 tokens: (10.4 − 0.5) / 99 = 0.1 s/token
    assert ok(0.5, 10.4, 100).tpot_s == pytest.approx(0.1)
    assert ok(0.5, 0.5, 1).tpot_s == 0.0  # vLLM's convention: one token, TPOT 0
    assert failed().tpot_s is None


@pytest.mark.parametrize(("result", "good"), [
    (ok(1.9, 11.8, 100), True),      # TPOT 0.1, everything within
    (ok(2.1, 10.0, 100), False),     # TTFT over
    (ok(0.5, 12.0, 100), False),     # TPOT (12 − 0.5) / 99 = 0.116 over
    (ok(1.0, 31.0, 400), False),     # TPOT 0.075 fine, e2e over
    (failed(), False),
])
def test_a_good_request_meets_every_bound(result: RequestResult, good: bool) -> None:
    assert meets(result, SLO) is good


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 50) == 5.0  # rank ceil(0.5 · 10) = 5
    assert percentile(values, 99) == 10.0  # rank ceil(9.9) = 10: the maximum
    assert percentile(values, 10) == 1.0
    assert percentile(reversed(values), 90) == 9.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 0)


def test_summary_rates_are_per_second_of_the_window() -> None:
    results = [ok(1.0, 10.9, 100), ok(1.0, 10.9, 100), ok(3.0, 12.9, 100), failed()]
    s = summarise(results, SLO, window_s=2.0)
    assert (s.requests, s.ok, s.good) == (4, 3, 2)
    assert s.goodput == 1.0  # 2 good / 2 s
    assert s.throughput_rps == 1.5  # 3 succeeded / 2 s
    assert s.throughput_tps == 150.0  # 300 tokens / 2 s
    assert s.attainment == 0.5
    assert s.errors == {"HTTP 503": 1}
    assert s.ttft_p50 == 1.0 and s.ttft_p99 == 3.0
    assert s.tpot_p50 == pytest.approx(0.1)


def test_shares_count_only_labelled_requests() -> None:
    assert shares(["radix", "radix", "spec", None]) == {"radix": 2 / 3, "spec": 1 / 3}
    assert shares([None]) == {}
    results = [ok(1, 2, 2, "radix"), ok(1, 2, 2, "spec"), ok(1, 2, 2, "radix"), failed()]
    assert summarise(results, SLO, 1.0).pool_share == {"radix": 2 / 3, "spec": 1 / 3}


def test_step_windows_cut_at_the_end_of_the_window() -> None:
    assert step_windows([20.0, 20.0, 20.0], 60.0) == [20.0, 20.0, 20.0]
    assert step_windows([20.0, 20.0, 20.0], 30.0) == [20.0, 10.0, 0.0]
    assert summarise([], SLO, 0.0).goodput == 0.0


def test_a_record_carries_the_request_its_route_and_replica(tmp_path: Path) -> None:
    route = Route("radix", "prefix_cache", "long_match",
                  {"pool": "radix", "lever": "prefix_cache", "reason": "long_match"})
    done = RequestResult("agent", 1, 2.0, None, ttft_s=0.5, e2e_s=2.5, output_tokens=5,
                         prompt_tokens=100, cached_tokens=64, route=route, key="agent-000003:2",
                         endpoint="1")
    refused = RequestResult("agent", 1, 3.0, "HTTP 503", e2e_s=0.01, key="agent-000004:0")
    path = tmp_path / "requests.jsonl"
    write_records(path, [done, refused])
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first == {"key": "agent-000003:2", "kind": "agent", "step": 1, "sent_s": 2.0,
                     "error": None, "ttft_s": 0.5, "tpot_s": 0.5, "e2e_s": 2.5,
                     "prompt_tokens": 100, "cached_tokens": 64, "output_tokens": 5,
                     "pool": "radix", "endpoint": "1", "route": dict(route.fields)}
    assert second["error"] == "HTTP 503" and second["endpoint"] is None
    assert second["tpot_s"] is None and second["route"] == {}
