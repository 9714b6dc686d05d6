"""Two ridge gateway PROCESSES sharing one real Redis, in front of 4 equal simulated engines.

- Same long prefix, sent alternately to either gateway → every request lands on one engine
  (the ``x-ridge-endpoint`` header: the endpoint's index in its pool).
- A burst of 64 concurrent requests (distinct prompts, 32 per gateway) → no engine gets more
  than its fair share (16) + :data:`TOLERANCE`. The tolerance covers what the shared state
  does not decide: the engines' own running/waiting gauges, polled once a second by each
  gateway at a different instant, enter every endpoint's load (``routing.load``).
- Killing redis-server mid-run loses no request (the gateways route on local state); once
  a server answers again on the same port, sharing is restored: the same-prefix check passes
  again.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.harness import free_ports
from tests.integration.redis_server import RedisServer, running_redis
from tests.real_engine.servers import Server, spawn, start_ridge, stop_all, wait_ready, write_fleet

MODEL = "llama-3-8b"
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 16384}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
SYSTEM = " ".join(f"Rule {i}: answer politely, cite sources, and keep to the topic." for i in
                  range(60))  # ≈ 3,800 characters ≈ 950 tokens
ENGINES, BURST = 4, 64
TOLERANCE = 3  # requests above the fair share of BURST / ENGINES = 16


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def gateways(redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        list[Server]]:
    tmp = tmp_path_factory.mktemp("two-gateways")
    ports = free_ports(ENGINES)
    fleet = write_fleet({"pools": [{
        "name": "main", "engine": "vllm", "models": [MODEL], "model": FACTS, "hardware": L4,
        "levers": {"prefix_caching": True},
        "endpoints": [f"http://127.0.0.1:{p}" for p in ports]}]}, tmp / "fleet.yaml")
    sim = spawn("sim", [sys.executable, "-m", "backends.sim", "--config", str(fleet),
                        "--speed", "5"], dict(os.environ), tmp, f"http://127.0.0.1:{ports[0]}")
    servers = [sim]
    try:
        wait_ready([sim], "/health", 30.0)
        env = {"RIDGE_REDIS_URL": redis.url, "RIDGE_STATE__REDIS_PROBE_INTERVAL_S": "0.2"}
        for name in ("ridge-a", "ridge-b"):
            servers.append(start_ridge(fleet, tmp, name, env))
        yield servers[1:]
    finally:
        stop_all(servers)


async def _chat(session: aiohttp.ClientSession, gateway: Server, text: str,
                max_tokens: int = 8) -> tuple[int, str]:
    body = {"model": MODEL, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": text}]}
    async with session.post(gateway.url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status, resp.headers.get("x-ridge-endpoint", "?")


def _distinct(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{i:05d} " * 20 + "tell me something new"}]


async def _same_prefix_lands_on_one_engine(gateways: list[Server]) -> None:
    async with aiohttp.ClientSession() as session:
        seen = [await _chat(session, gateways[i % 2], f"question {i}") for i in range(8)]
    assert [status for status, _ in seen] == [200] * 8
    assert len({engine for _, engine in seen}) == 1, seen


async def test_same_prefix_alternately_to_either_gateway_lands_on_one_engine(
    gateways: list[Server],
) -> None:
    await _same_prefix_lands_on_one_engine(gateways)


async def test_a_burst_split_across_gateways_spreads_fairly(gateways: list[Server]) -> None:
    async def one(session: aiohttp.ClientSession, i: int) -> tuple[int, str]:
        body = {"model": MODEL, "max_tokens": 48, "messages": _distinct(1000 + i)}
        async with session.post(gateways[i % 2].url + "/v1/chat/completions",
                                json=body) as resp:
            await resp.read()
            return resp.status, resp.headers.get("x-ridge-endpoint", "?")

    await asyncio.sleep(1.5)  # let earlier tests' requests leave the engines' gauges
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        results = await asyncio.gather(*(one(session, i) for i in range(BURST)))
    assert all(status == 200 for status, _ in results), results
    counts = Counter(engine for _, engine in results)
    print(f"burst of {BURST} over {ENGINES} engines: {dict(sorted(counts.items()))}")
    assert set(counts) <= {str(i) for i in range(ENGINES)}
    assert max(counts.values()) <= BURST // ENGINES + TOLERANCE, counts


async def test_killing_redis_loses_no_request_and_restarting_restores_sharing(
    redis: RedisServer, gateways: list[Server],
) -> None:
    killed = asyncio.Event()
    after_kill: list[int] = []

    async def stream(session: aiohttp.ClientSession, offset: int) -> list[int]:
        statuses = []
        for i in range(30):
            if i == 10 and not killed.is_set():
                redis.stop()  # mid-run: a third of the requests done, none in the way
                killed.set()
            body = {"model": MODEL, "max_tokens": 8, "messages": _distinct(5000 + offset + i)}
            async with session.post(gateways[i % 2].url + "/v1/chat/completions",
                                    json=body) as resp:
                await resp.read()
                statuses.append(resp.status)
                if killed.is_set():
                    after_kill.append(resp.status)
        return statuses

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        results = await asyncio.gather(stream(session, 0), stream(session, 100))
        assert results[0] + results[1] == [200] * 60
        assert len(after_kill) >= 30
        assert [await _backend_up(session, g) for g in gateways] == [0.0, 0.0]
        redis.start()
        for _ in range(100):
            if [await _backend_up(session, g) for g in gateways] == [1.0, 1.0]:
                break
            await asyncio.sleep(0.1)
        assert [await _backend_up(session, g) for g in gateways] == [1.0, 1.0]
    await _same_prefix_lands_on_one_engine(gateways)


async def _backend_up(session: aiohttp.ClientSession, gateway: Server) -> float | None:
    async with session.get(gateway.url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('ridge_state_backend_up{backend="redis"}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_gateways_logged_the_outage_once(gateways: list[Server]) -> None:
    for gateway in gateways:
        log = Path(gateway.log_path).read_text(errors="replace")
        assert log.count("Redis unavailable") == 1, gateway.log_tail()
        assert log.count("Redis answers again") == 1, gateway.log_tail()
