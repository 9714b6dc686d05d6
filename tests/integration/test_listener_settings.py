"""The listeners' settings over real sockets: an engine API key sent upstream, the admin
listener, CORS."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from config.fleet import FleetConfigError, parse_fleet
from gateway.app import create_app
from tests.fakes.engine import FakeEngine
from tests.fakes.harness import HARDWARE, MODEL_FACTS, free_ports, quick_settings, running_ridge
from tests.real_engine.servers import start_ridge, stop_all, write_fleet

CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
ENGINE_KEY = "engine-secret-7f3a"


def keyed_fleet(url: str) -> dict[str, object]:
    return {"pools": [{"name": "p", "engine": "vllm", "models": ["m"], "endpoints": [url],
                       "model": MODEL_FACTS, "hardware": HARDWARE,
                       "api_key_env": "RIDGE_TEST_ENGINE_KEY"}]}


@pytest.fixture
async def keyed_engine() -> AsyncIterator[FakeEngine]:
    engine = FakeEngine(api_key=ENGINE_KEY)
    await engine.start()
    yield engine
    await engine.stop()


async def test_a_pools_engine_key_is_sent_upstream(
        keyed_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_TEST_ENGINE_KEY", ENGINE_KEY)
    fleet = parse_fleet(keyed_fleet(keyed_engine.url))
    async with running_ridge(fleet) as ridge, aiohttp.ClientSession() as session, \
            session.post(ridge.url + "/v1/chat/completions", json=CHAT,
                         headers={"authorization": "Bearer client-key"}) as resp:
        assert resp.status == 200, await resp.text()


async def test_without_the_key_the_engine_refuses_and_the_client_sees_its_answer(
        keyed_engine: FakeEngine) -> None:
    raw = keyed_fleet(keyed_engine.url)
    raw["pools"][0].pop("api_key_env")  # type: ignore[index]
    fleet = parse_fleet(raw)
    async with running_ridge(fleet) as ridge, aiohttp.ClientSession() as session, \
            session.post(ridge.url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 401


def test_an_unset_engine_key_variable_stops_the_start_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIDGE_TEST_ENGINE_KEY", raising=False)
    with pytest.raises(FleetConfigError, match="RIDGE_TEST_ENGINE_KEY"):
        create_app(quick_settings(), parse_fleet(keyed_fleet("http://127.0.0.1:9")))


async def test_the_admin_routes_live_on_the_admin_port_only(tmp_path: Path) -> None:
    engine = FakeEngine()
    await engine.start()
    (admin_port,) = free_ports(1)
    fleet = write_fleet({"pools": [{"name": "p", "engine": "vllm", "models": ["m"],
                                    "endpoints": [engine.url], "model": MODEL_FACTS,
                                    "hardware": HARDWARE}]}, tmp_path / "fleet.yaml")
    ridge = await asyncio.to_thread(start_ridge, fleet, tmp_path, "ridge",
                                    {"RIDGE_ADMIN_PORT": str(admin_port)})
    admin = f"http://127.0.0.1:{admin_port}"
    try:
        async with aiohttp.ClientSession() as session:
            expected = [(ridge.url, "/metrics", 404), (ridge.url, "/docs", 404),
                        (ridge.url, "/status", 404), (ridge.url, "/dashboard", 404),
                        (ridge.url, "/health", 200), (admin, "/metrics", 200),
                        (admin, "/openapi.json", 200), (admin, "/health", 200),
                        (admin, "/status", 200), (admin, "/dashboard", 200),
                        (admin, "/dashboard/app.js", 200), (admin, "/dashboard/nope", 404),
                        (admin, "/v1/models", 404)]
            for base, path, status in expected:
                async with session.get(base + path) as resp:
                    assert resp.status == status, (base, path)
            async with session.post(admin + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 404
            async with session.post(ridge.url + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200
    finally:
        await asyncio.to_thread(stop_all, [ridge])
        await engine.stop()


async def test_cors_is_off_by_default_and_answers_preflights_when_configured(
        engines: list[FakeEngine]) -> None:
    fleet = parse_fleet({"pools": [{"name": "p", "engine": "vllm", "models": ["m"],
                                    "endpoints": [engines[0].url], "model": MODEL_FACTS,
                                    "hardware": HARDWARE}]})
    origin = "https://app.example.com"
    preflight = {"origin": origin, "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type"}
    async with aiohttp.ClientSession() as session:
        async with running_ridge(fleet) as ridge, session.post(
                ridge.url + "/v1/chat/completions", json=CHAT, headers={"origin": origin}) as resp:
            assert "access-control-allow-origin" not in resp.headers
        async with running_ridge(fleet, quick_settings(cors_origins=[origin])) as ridge:
            async with session.options(ridge.url + "/v1/chat/completions",
                                       headers=preflight) as resp:
                assert resp.status == 200
                assert resp.headers["access-control-allow-origin"] == origin
                assert "POST" in resp.headers["access-control-allow-methods"]
            async with session.post(ridge.url + "/v1/chat/completions", json=CHAT,
                                    headers={"origin": origin}) as resp:
                assert resp.status == 200
                assert resp.headers["access-control-allow-origin"] == origin
                assert "x-request-id" in resp.headers["access-control-expose-headers"]
            async with session.options(ridge.url + "/v1/chat/completions",
                                       headers={**preflight, "origin": "https://evil"}) as resp:
                assert resp.status == 400
