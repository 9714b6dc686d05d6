"""Admission control across two ridge gateway PROCESSES sharing one real Redis: the requests
one gateway holds on an engine fill it for the other. Gateway A holds two streams on an engine
whose capacity is two (its KV cache 0.9 used); gateway B — which has sent nothing — refuses a
request with the 503 ``overloaded``, because the shared router state counts A's two requests;
once A's clients leave, B serves. Waits are bounded hang detectors, not deadlines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes.engine import FakeEngine
from tests.fakes.harness import HARDWARE, MODEL_FACTS
from tests.integration.redis_server import RedisServer, running_redis
from tests.real_engine.servers import Server, start_ridge, stop_all, write_fleet

CHAT = "/v1/chat/completions"
POLLS = 600  # × 0.05 s: a hang detector


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    """Two requests at a time fill its KV cache to 0.9: capacity 0.9 × 2 ÷ 0.9 = 2."""
    fake = FakeEngine(token_interval_s=0.05, kv_per_request=0.45)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def gateways(engine: FakeEngine, redis: RedisServer,
                   tmp_path: Path) -> AsyncIterator[list[Server]]:
    fleet = write_fleet({
        "pools": [{"name": "p", "engine": "vllm", "models": ["m"], "endpoints": [engine.url],
                   "model": MODEL_FACTS, "hardware": HARDWARE}],
        "slos": {"*": {"ttft_s": 0.3}}}, tmp_path / "fleet.yaml")
    env = {"RIDGE_REDIS_URL": redis.url, "RIDGE_REGISTRY__POLL_INTERVAL_S": "0.1"}
    servers: list[Server] = []
    try:
        for name in ("ridge-a", "ridge-b"):  # in a thread: the engine answers their probes
            servers.append(await asyncio.to_thread(start_ridge, fleet, tmp_path, name, env))
        yield servers
    finally:
        await asyncio.to_thread(stop_all, servers)


def body(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, "stream": stream}


async def metric(session: aiohttp.ClientSession, gateway: Server, line_start: str) -> float:
    async with session.get(gateway.url + "/metrics") as resp:
        text = await resp.text()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(line_start)]
    return sum(values)


async def until_metric(session: aiohttp.ClientSession, gateway: Server, line_start: str,
                       value: float) -> None:
    for _ in range(POLLS):
        if await metric(session, gateway, line_start) == pytest.approx(value):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{gateway.name}: {line_start} never reached {value}")


async def test_a_gateway_refuses_when_another_gateway_fills_the_pool(
        gateways: list[Server], engine: FakeEngine) -> None:
    a, b = gateways
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        streams = [await session.post(a.url + CHAT, json=body(4000, True)) for _ in range(2)]
        for stream in streams:
            assert stream.status == 200
            await stream.content.readline()
        assert engine.running == 2
        # B has polled the engine running A's two requests: its capacity is known (2)
        await until_metric(session, b, "ridge_engine_requests_running{", 2.0)
        await until_metric(session, b, "ridge_engine_kv_cache_usage_ratio{", 0.9)
        async with session.post(b.url + CHAT, json=body(3, False)) as refused:
            reply = await refused.json()
            assert refused.status == 503, reply
            assert refused.headers["Retry-After"].isdigit()
        assert reply["error"]["code"] == "overloaded"
        assert engine.running == 2  # the engine never saw B's request
        for stream in streams:  # the load drops: A's clients go away
            stream.close()
        for _ in range(POLLS):
            async with session.post(b.url + CHAT, json=body(3, False)) as resp:
                if resp.status == 200:
                    break
                assert resp.status == 503
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("B never served once A's requests ended")
        rejected = await metric(session, b, "ridge_admission_rejected_total{")
        assert rejected >= 1
        assert await metric(session, a, "ridge_admission_rejected_total{") == 0
