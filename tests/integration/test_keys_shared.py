"""API keys and rate limits across two ridge gateway PROCESSES sharing one real Redis.

Keys are managed with the real ``ridge keys`` command against that Redis; both gateways
(``RIDGE_KEYS_REFRESH_S=0.2``) pick them up. Then: a key's request limit is one limit for
both gateways, so is its concurrency limit; a revoked key is refused by both; a key sees only
its models; the admin routes need an admin key. Waits are bounded hang detectors, and the
request-limit check allows for the refill the elapsed time gives (no wall-clock assumption).
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.harness import free_ports
from tests.integration.redis_server import RedisServer, running_redis
from tests.real_engine.servers import (
    ROOT,
    Server,
    spawn,
    start_ridge,
    stop_all,
    wait_ready,
    write_fleet,
)

MODEL, OTHER = "llama-3-8b", "smollm2-135m"
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 16384}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
WAIT_S = 60.0


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def gateways(redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        list[Server]]:
    tmp = tmp_path_factory.mktemp("keys-shared")
    ports = free_ports(2)
    fleet = write_fleet({"pools": [{
        "name": "main", "engine": "vllm", "models": [MODEL, OTHER], "model": FACTS,
        "hardware": L4, "endpoints": [f"http://127.0.0.1:{p}" for p in ports]}]},
        tmp / "fleet.yaml")
    sim = spawn("sim", [sys.executable, "-m", "backends.sim", "--config", str(fleet),
                        "--speed", "5"], dict(os.environ), tmp, f"http://127.0.0.1:{ports[0]}")
    servers = [sim]
    try:
        wait_ready([sim], "/health", 30.0)
        env = {"RIDGE_REDIS_URL": redis.url, "RIDGE_KEYS_REFRESH_S": "0.2"}
        for name in ("ridge-a", "ridge-b"):
            servers.append(start_ridge(fleet, tmp, name, env))
        yield servers[1:]
    finally:
        stop_all(servers)


def ridge_keys(redis: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RIDGE_REDIS_URL": redis.url}
    env.pop("RIDGE_KEYS_FILE", None)
    return subprocess.run([str(ROOT / ".venv" / "bin" / "ridge"), "keys", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def add_key(redis: RedisServer, name: str, *flags: str) -> str:
    done = ridge_keys(redis, "add", name, *flags)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as s:
        yield s


async def chat(session: aiohttp.ClientSession, gateway: Server, key: str | None,
               model: str = MODEL, max_tokens: int = 4) -> tuple[int, dict[str, str], bytes]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello"}]}
    async with session.post(gateway.url + "/v1/chat/completions", json=body,
                            headers=headers) as resp:
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read()


async def until_status(session: aiohttp.ClientSession, gateway: Server, key: str | None,
                       status: int) -> None:
    """Wait (bounded) until ``gateway`` answers ``key``'s request with ``status``."""
    deadline = time.monotonic() + WAIT_S
    while (await chat(session, gateway, key))[0] != status:
        assert time.monotonic() < deadline, f"{gateway.name} never answered {status}"
        await asyncio.sleep(0.1)


async def test_keys_added_in_redis_are_required_by_both_gateways(
        redis: RedisServer, gateways: list[Server], session: aiohttp.ClientSession) -> None:
    for gateway in gateways:
        assert (await chat(session, gateway, None))[0] == 200  # no key anywhere: open
    key = add_key(redis, "everyone")
    for gateway in gateways:
        await until_status(session, gateway, None, 401)
        assert (await chat(session, gateway, key))[0] == 200
        status, headers, body = await chat(session, gateway, "rk-not-a-key")
        assert status == 401 and b"invalid_api_key" in body and b"rk-not" not in body
        assert headers["www-authenticate"] == "Bearer"


async def test_a_request_limit_is_one_limit_for_both_gateways(
        redis: RedisServer, gateways: list[Server], session: aiohttp.ClientSession) -> None:
    key = add_key(redis, "rpm-3", "--rpm", "3")
    for gateway in gateways:
        await until_status(session, gateway, key, 200)  # known to both (and 2 taken)
    started = time.monotonic()
    statuses = [(await chat(session, gateways[i % 2], key))[:2] for i in range(4)]
    refill = math.floor((time.monotonic() - started) * 3 / 60.0)
    passed = [s for s, _ in statuses if s == 200]
    assert 1 <= len(passed) <= 1 + refill + 1, statuses  # 3 - 2 taken, + refill
    status, headers = next(s for s in statuses if s[0] == 429)
    assert int(headers["retry-after"]) >= 1
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"


async def test_a_concurrency_limit_is_one_limit_for_both_gateways(
        redis: RedisServer, gateways: list[Server], session: aiohttp.ClientSession) -> None:
    key = add_key(redis, "two-at-once", "--max-concurrent", "2")
    for gateway in gateways:
        await until_status(session, gateway, key, 200)
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": MODEL, "max_tokens": 4000, "stream": True,
            "messages": [{"role": "user", "content": "a long story"}]}
    streams = [await session.post(g.url + "/v1/chat/completions", json=body, headers=headers)
               for g in gateways]
    try:
        for stream in streams:
            assert stream.status == 200
            await stream.content.readline()  # under way
        status, _, answer = await chat(session, gateways[0], key)
        assert status == 429 and b"concurrent" in answer
    finally:
        for stream in streams:
            stream.close()  # the client leaves: ridge ends the requests and their leases
    await until_status(session, gateways[1], key, 200)


async def test_a_revoked_key_is_refused_by_both(
        redis: RedisServer, gateways: list[Server], session: aiohttp.ClientSession) -> None:
    key = add_key(redis, "short-lived")
    for gateway in gateways:
        await until_status(session, gateway, key, 200)
    assert ridge_keys(redis, "revoke", "short-lived").returncode == 0
    for gateway in gateways:
        await until_status(session, gateway, key, 401)


async def test_a_key_sees_only_its_models(
        redis: RedisServer, gateways: list[Server], session: aiohttp.ClientSession) -> None:
    key = add_key(redis, "small-only", "--models", OTHER)
    gateway = gateways[1]
    await until_status(session, gateway, key, 404)  # MODEL is not one of its models
    status, _, body = await chat(session, gateway, key)
    assert status == 404 and b"model_not_found" in body
    assert (await chat(session, gateway, key, OTHER))[0] == 200
    async with session.get(gateway.url + "/v1/models",
                           headers={"authorization": f"Bearer {key}"}) as resp:
        assert resp.status == 200
        assert [m["id"] for m in (await resp.json())["data"]] == [OTHER]


async def test_the_admin_routes_need_an_admin_key(
        redis: RedisServer, gateways: list[Server], session: aiohttp.ClientSession) -> None:
    user, admin = add_key(redis, "user"), add_key(redis, "operator", "--admin")
    gateway = gateways[0]
    await until_status(session, gateway, admin, 200)
    for path in ("/metrics", "/openapi.json", "/status"):
        expected = {None: 401, user: 403, admin: 200}
        for key, status in expected.items():
            headers = {"authorization": f"Bearer {key}"} if key else {}
            async with session.get(gateway.url + path, headers=headers) as resp:
                assert resp.status == status, (path, key is admin, await resp.text())
    for path in ("/health", "/dashboard", "/dashboard/style.css"):  # the page holds no data
        async with session.get(gateway.url + path) as resp:
            assert resp.status == 200, path


def test_keys_never_reach_the_gateway_logs(gateways: list[Server]) -> None:
    for gateway in gateways:
        text = Path(gateway.log_path).read_text(errors="replace")
        assert "rk-" not in text.replace("rk-not-a-key", "")
