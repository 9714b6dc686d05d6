"""Admission control over real HTTP: a saturated pool answers 503 with ``Retry-After``, and
serves again once its load drops. No wall-clock deadline is asserted: the refusal comes within
the request's budget (its 0.3 s TTFT SLO), whatever the machine's speed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from config.fleet import Fleet, parse_fleet
from tests.fakes.engine import FakeEngine
from tests.fakes.harness import HARDWARE, MODEL_FACTS, RunningRidge, running_ridge

CHAT = "/v1/chat/completions"


def fleet(url: str) -> Fleet:
    return parse_fleet({
        "pools": [{"name": "p", "engine": "vllm", "models": ["m"], "endpoints": [url],
                   "model": MODEL_FACTS, "hardware": HARDWARE}],
        "slos": {"*": {"ttft_s": 0.3}},
    })


def body(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, "stream": stream}


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    """Two requests at a time fill its KV cache to 0.9: capacity 0.9 × 2 ÷ 0.9 = 2."""
    fake = FakeEngine(token_interval_s=0.05, kv_per_request=0.45)
    await fake.start()
    yield fake
    await fake.stop()


async def engine_seen_full(ridge: RunningRidge) -> None:
    """Until ridge's registry has polled the engine running its two requests."""
    for _ in range(500):
        ep = ridge.gateway.registry.snapshot()[0].endpoints[0]
        if ep.metrics.running == 2 and ep.metrics.kv_cache_usage == pytest.approx(0.9):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the engine's figures never reached ridge")


async def test_a_saturated_pool_refuses_with_retry_after_and_serves_once_load_drops(
        engine: FakeEngine) -> None:
    async with running_ridge(fleet(engine.url)) as ridge, aiohttp.ClientSession() as session:
        streams = [await session.post(ridge.url + CHAT, json=body(2000, True)) for _ in range(2)]
        for stream in streams:
            assert stream.status == 200
            await stream.content.readline()
        await engine_seen_full(ridge)
        async with session.post(ridge.url + CHAT, json=body(3, False)) as refused:
            assert refused.status == 503
            reply = await refused.json()
            retry_after = refused.headers["Retry-After"]
        assert reply["error"]["code"] == "overloaded"
        assert reply["error"]["type"] == "service_unavailable"
        assert "'p' is at capacity" in reply["error"]["message"]
        assert retry_after.isdigit() and int(retry_after) >= 1
        rejected = sum(ridge.metrics.get_sample_value(
            "ridge_admission_rejected_total", {"pool": "p", "reason": reason}) or 0
            for reason in ("would_miss_slo", "wait_expired", "queue_full"))
        assert rejected == 1
        assert ridge.metrics.get_sample_value(  # counted under the pool that refused it
            "ridge_requests_total", {"model": "m", "pool": "p", "status": "503"}) == 1
        for stream in streams:  # the load drops: the clients go away, the engine aborts
            stream.close()
        for _ in range(500):
            if not ridge.gateway.state.in_flight():
                break
            await asyncio.sleep(0.02)
        async with session.post(ridge.url + CHAT, json=body(3, False)) as served:
            assert served.status == 200
            assert (await served.json())["choices"][0]["message"]["content"]
