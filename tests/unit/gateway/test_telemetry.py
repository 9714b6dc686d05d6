from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.telemetry import RequestRecord, Telemetry


def test_tpot_is_time_after_the_first_token_per_later_token() -> None:
    # 2.0 s end to end, first token at 0.2 s, 10 tokens: 1.8 s over 9 tokens = 0.2 s/token
    assert RequestRecord("m", "p", 200, e2e_s=2.0, ttft_s=0.2,
                         completion_tokens=10).tpot_s == pytest.approx(0.2)
    assert RequestRecord("m", "p", 200, e2e_s=2.0, ttft_s=0.2, completion_tokens=1).tpot_s is None
    assert RequestRecord("m", "p", 200, e2e_s=2.0, completion_tokens=10).tpot_s is None


def test_record_labels_are_bounded() -> None:
    registry = CollectorRegistry()
    t = Telemetry(registry, frozenset({"m"}))
    t.record(RequestRecord("m", "p", 200, e2e_s=1.0, ttft_s=0.1, completion_tokens=5))
    t.record(RequestRecord("attacker-chosen-name", "none", 404, e2e_s=0.001))
    get = registry.get_sample_value
    assert get("ridge_requests_total", {"model": "m", "pool": "p", "status": "200"}) == 1
    assert get("ridge_requests_total", {"model": "other", "pool": "none", "status": "404"}) == 1
    assert get("ridge_time_per_output_token_seconds_sum", {"model": "m", "pool": "p"}) == (
        pytest.approx(0.225))
    assert get("ridge_request_duration_seconds_count", {"model": "other", "pool": "none"}) is None
