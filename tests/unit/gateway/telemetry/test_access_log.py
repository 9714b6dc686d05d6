"""gateway.telemetry.access_log: one searchable line per engine-route request."""

from __future__ import annotations

import json
import logging

import pytest

from gateway.telemetry.access_log import AccessLog, NotProxied
from gateway.telemetry.prometheus import RequestRecord

STREAM = RequestRecord(model="m", pool="spec", status=200, e2e_s=1.23456, ttft_s=0.0871,
                       lever="speculative", endpoint="http://10.0.0.7:8000")


def test_a_text_line_has_every_field(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "ridge.access"):
        AccessLog("text").write(STREAM, "req-1", "team-a", "/v1/chat/completions")
    assert caplog.messages == [
        "request_id=req-1 key=team-a path=/v1/chat/completions model=m pool=spec "
        "lever=speculative endpoint=http://10.0.0.7:8000 status=200 ttft_ms=87.1 "
        "duration_ms=1234.6"]


def test_a_json_line_and_a_refusal_without_a_key(caplog: pytest.LogCaptureFixture) -> None:
    refused = RequestRecord(model="m", pool="none", status=503, e2e_s=0.002)
    with caplog.at_level(logging.INFO, "ridge.access"):
        AccessLog("json").write(refused, "req-2", None, "/v1/completions")
    assert json.loads(caplog.messages[0]) == {
        "request_id": "req-2", "key": "-", "path": "/v1/completions", "model": "m",
        "pool": "none", "lever": "-", "endpoint": "-", "status": 503, "ttft_ms": None,
        "duration_ms": 2.0}


def test_uvicorns_line_is_dropped_for_the_engine_routes_only() -> None:
    keep = NotProxied({"/v1/chat/completions"})

    def line(path: str) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                                 ("127.0.0.1:5", "POST", path, "1.1", 200), None)

    assert not keep.filter(line("/v1/chat/completions"))
    assert keep.filter(line("/metrics")) and keep.filter(line("/health"))
