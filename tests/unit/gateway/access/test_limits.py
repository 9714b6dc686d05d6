"""Rate limits: the bucket arithmetic on worked numbers, the local limiter, the 429s."""

from __future__ import annotations

import math

import pytest

from gateway.access.keys import KeyLimits, KeyRecord, make_record, new_key
from gateway.access.limits import (
    Bucket,
    LimitDecision,
    LocalLimiter,
    RedisLimiter,
    corrected,
    duration,
    limit_headers,
    refill,
    seconds_until,
    take,
)
from gateway.server.errors import GatewayError
from tests.fakes.harness import ends_without_suspending


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def key(**limits: int) -> KeyRecord:
    return make_record(new_key(), "k", limits=KeyLimits(**limits))  # type: ignore[arg-type]


def test_refill_worked_numbers() -> None:
    # 60 per minute = 1 per second: 10 s after a level of 5, it holds 15; never above 60.
    assert refill(None, 60, 0.0) == 60
    assert refill(Bucket(5.0, 100.0), 60, 110.0) == pytest.approx(15.0)
    assert refill(Bucket(5.0, 100.0), 60, 1000.0) == 60
    # 600 tokens per minute = 10 per second; from -50 (debt), 100 tokens need 15 s.
    assert seconds_until(-50.0, 100.0, 600) == pytest.approx(15.0)
    assert seconds_until(200.0, 100.0, 600) == 0.0


def test_take_checks_every_limit_together() -> None:
    limits = KeyLimits(rpm=2, tpm=100, max_concurrent=1)
    ok = take(limits, 40, 0.0, None, None, 0)
    assert ok == LimitDecision(None, 1.0, 60.0)
    assert take(limits, 40, 0.0, None, None, 1).refused == "concurrent"
    assert take(limits, 40, 0.0, Bucket(0.5, 0.0), None, 0).refused == "requests"
    tokens = take(limits, 40, 0.0, None, Bucket(10.0, 0.0), 0)
    assert tokens.refused == "tokens" and tokens.retry_after_s == pytest.approx(18.0)
    assert math.isinf(take(limits, 101, 0.0, None, None, 0).retry_after_s)


def test_corrected_gives_back_or_takes_within_bounds() -> None:
    assert corrected(100.0, charged=300, used=120, capacity=1000) == 280.0
    assert corrected(100.0, charged=50, used=400, capacity=1000) == -250.0
    assert corrected(0.0, charged=0, used=5000, capacity=1000) == -1000.0
    assert corrected(990.0, charged=500, used=0, capacity=1000) == 1000.0


def test_requests_per_minute_worked_example() -> None:
    clock = Clock()
    limiter = LocalLimiter(clock)
    record = key(rpm=3)
    for _ in range(3):
        limiter.admit_now(record, 10)
    with pytest.raises(GatewayError) as caught:
        limiter.admit_now(record, 10)
    exc = caught.value
    assert exc.status == 429 and exc.code == "rate_limit_exceeded" and exc.kind == "requests"
    headers = dict(exc.headers)
    assert headers[b"retry-after"] == b"20"  # 1 request at 3/min takes 20 s
    assert headers[b"x-ratelimit-limit-requests"] == b"3"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert "'k'" in exc.message and "RPM" in exc.message
    clock.now += 20.0
    limiter.admit_now(record, 10)


def test_tokens_are_charged_then_corrected_by_the_usage() -> None:
    clock = Clock()
    limiter = LocalLimiter(clock)
    record = key(tpm=1000)
    grant = limiter.admit_now(record, 600)
    with pytest.raises(GatewayError) as caught:
        limiter.admit_now(record, 600)  # 400 left
    assert caught.value.kind == "tokens"
    limiter.settle_now(grant, 100)  # used 100 of the 600 charged: 500 back
    limiter.admit_now(record, 600)


def test_a_request_larger_than_the_token_limit_can_never_pass() -> None:
    with pytest.raises(GatewayError) as caught:
        LocalLimiter(Clock()).admit_now(key(tpm=100), 500)
    assert caught.value.code == "request_too_large"
    assert b"retry-after" not in dict(caught.value.headers)


def test_concurrency_leases_are_given_back() -> None:
    limiter = LocalLimiter(Clock())
    record = key(max_concurrent=2)
    grants = [limiter.admit_now(record, 1) for _ in range(2)]
    with pytest.raises(GatewayError) as caught:
        limiter.admit_now(record, 1)
    assert dict(caught.value.headers)[b"retry-after"] == b"1"
    limiter.settle_now(grants[0], None)
    limiter.admit_now(record, 1)


class DownBackend:
    """Redis down: every grant is taken locally."""

    up = False

    class client:  # noqa: N801 - stands in for a Redis client, whose scripts are never run
        @staticmethod
        def register_script(source: str) -> None:
            return None


async def test_a_grant_taken_in_this_process_settles_without_suspending() -> None:
    """What :meth:`gateway.access.control.Access.settle` relies on to settle such a grant in the
    request's own task, with no task to shield it."""
    record = key(tpm=1000, max_concurrent=1)
    for limiter in (LocalLimiter(Clock()), RedisLimiter(DownBackend(), "t:", 60.0)):
        grant = await limiter.admit(record, 10)
        assert not grant.shared
        assert ends_without_suspending(limiter.settle(grant, 4))
        await limiter.admit(record, 10)  # the lease was given back


def test_a_worker_enforces_its_share_rounded_up() -> None:
    limiter = LocalLimiter(Clock(), share=0.5)
    assert limiter.scaled(KeyLimits(rpm=5, tpm=1000, max_concurrent=1)) == \
        KeyLimits(rpm=3, tpm=500, max_concurrent=1)


def test_limit_headers_name_the_levels_and_reset_times() -> None:
    headers = dict(limit_headers(KeyLimits(rpm=60, tpm=6000), LimitDecision(None, 59.0, 5400.0)))
    assert headers == {
        b"x-ratelimit-limit-requests": b"60", b"x-ratelimit-remaining-requests": b"59",
        b"x-ratelimit-reset-requests": b"1s",
        b"x-ratelimit-limit-tokens": b"6000", b"x-ratelimit-remaining-tokens": b"5400",
        b"x-ratelimit-reset-tokens": b"6s"}


@pytest.mark.parametrize(("seconds", "text"), [
    (0.02, "20ms"), (1.0, "1s"), (1.5, "1.5s"), (360.0, "6m0s"), (3723.0, "1h2m3s")])
def test_durations_in_openai_form(seconds: float, text: str) -> None:
    assert duration(seconds) == text
