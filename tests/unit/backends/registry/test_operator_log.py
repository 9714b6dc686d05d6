"""The registry's operator log: no credentials a URL carries reach it."""

from __future__ import annotations

import logging

import pytest

from backends.registry.breaker import BreakerConfig
from backends.registry.endpoints import EndpointRegistry
from backends.registry.status import PollResult
from config.fleet import parse_fleet
from tests.unit.backends.registry.fakes import FakeClock, pool


def test_credentials_in_urls_never_reach_the_log(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="backends.registry.endpoints")
    secret = "http://ops:s3cret@d1:8000"
    registry = EndpointRegistry(
        parse_fleet({"pools": [pool("d", "vllm", ["m"], [secret])]}),
        breaker=BreakerConfig(failures=1), clock=clock)
    registry.record_poll(secret, PollResult(clock.t, healthy=True))
    registry.mark_failed(secret, f"request failed: {secret}/v1/completions: reset")
    clock.t += 10
    registry.record_poll(secret, PollResult(clock.t, healthy=True))
    registry.mark_succeeded(secret)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) >= 5 and all("s3cret" not in m for m in messages)
    assert "endpoint http://d1:8000 (pool d) is down: request failed: http://d1:8000/v1/" \
           "completions: reset" in messages
