"""The rate limits' Lua script against a real redis-server: the same decisions as the Python
arithmetic (:func:`gateway.access.limits.take`), leases that expire, the local fallback."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.access.keys import KeyLimits, KeyRecord, make_record, new_key
from gateway.access.limits import Grant, LocalLimiter, RateLimiter, RedisLimiter
from gateway.server.errors import GatewayError
from tests.integration.redis_server import RedisServer, running_redis


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@dataclass
class Backend:
    client: Any
    up: bool = True


@pytest.fixture
async def backend(redis_server: RedisServer) -> AsyncIterator[Backend]:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    yield Backend(client)
    await client.aclose()


async def outcome(limiter: RateLimiter, record: KeyRecord, tokens: int) -> tuple[
        str | None, Grant | None]:
    try:
        return None, await limiter.admit(record, tokens)
    except GatewayError as exc:
        if exc.code != "rate_limit_exceeded":
            return exc.code, None
        return "concurrent" if "concurrent requests" in exc.message else exc.kind, None


def remaining(grant: Grant) -> dict[bytes, int]:
    return {name: int(value) for name, value in grant.headers
            if name.startswith(b"x-ratelimit-remaining-")}


async def test_the_script_decides_as_the_python_arithmetic(backend: Backend) -> None:
    """Random admissions and settlements on both; token amounts are multiples of 100, far
    from what the refill of the test's duration (under 20 tokens) could move."""
    rng = random.Random(7)
    for trial in range(20):
        limits = KeyLimits(rpm=rng.choice([None, 3, 8]), tpm=rng.choice([None, 1000, 2500]),
                           max_concurrent=rng.choice([None, 2, 4]))
        record = make_record(new_key(), f"trial-{trial}", limits=limits)
        shared, local = RedisLimiter(backend, f"t{trial}:", 60.0), LocalLimiter()
        held: list[tuple[Grant, Grant]] = []
        for _ in range(25):
            if held and rng.random() < 0.35:
                a, b = held.pop(rng.randrange(len(held)))
                used = rng.choice([None, 0, 100, 300, 900])
                await shared.settle(a, used)
                await local.settle(b, used)
                continue
            tokens = rng.choice([100, 200, 500])
            (kind_a, grant_a), (kind_b, grant_b) = (
                await outcome(shared, record, tokens), await outcome(local, record, tokens))
            assert kind_a == kind_b, (limits, tokens)
            if grant_a is not None and grant_b is not None:
                assert grant_a.shared and not grant_b.shared
                left_a, left_b = remaining(grant_a), remaining(grant_b)
                assert left_a.keys() == left_b.keys()
                for name, value in left_a.items():  # equal but for the refill meanwhile
                    assert abs(value - left_b[name]) <= 20, (name, value, left_b[name])
                held.append((grant_a, grant_b))


async def test_a_lease_not_given_back_expires(backend: Backend) -> None:
    record = make_record(new_key(), "crashy", limits=KeyLimits(max_concurrent=1))
    limiter = RedisLimiter(backend, "lease:", lease_ttl_s=0.3)
    await limiter.admit(record, 1)  # never settled: its gateway "died"
    assert (await outcome(limiter, record, 1))[0] == "concurrent"
    await asyncio.sleep(0.5)
    assert (await outcome(limiter, record, 1))[0] is None


async def test_while_redis_is_down_the_local_limits_stand_in(backend: Backend) -> None:
    record = make_record(new_key(), "fallback", limits=KeyLimits(rpm=1))
    limiter = RedisLimiter(backend, "down:", 60.0)
    backend.up = False
    grant = await limiter.admit(record, 1)
    assert not grant.shared
    assert (await outcome(limiter, record, 1))[0] == "requests"
    await limiter.settle(grant, 1)


async def test_a_failing_call_falls_back_to_the_local_limits(redis_server: RedisServer) -> None:
    client = Redis.from_url(f"redis://127.0.0.1:{redis_server.port + 1}/0",
                            socket_connect_timeout=0.5)  # nothing listens there
    try:
        limiter = RedisLimiter(Backend(client), "x:", 60.0)
        record = make_record(new_key(), "k", limits=KeyLimits(rpm=5))
        grant = await limiter.admit(record, 1)
        assert not grant.shared
    finally:
        await client.aclose()
