"""The pass-through floors relay bodies, answers and streams unchanged, round robin."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
import uvicorn
from aiohttp import web

from gateway.server.protocol import HttpLimits, with_limits
from ridge_bench.harness.upstream import MODEL, start_servers
from ridge_bench.overhead.passthrough import RidgeFloor, Upstreams, aiohttp_app, fastapi_app

CHUNKS = 3


@pytest.fixture
async def upstreams() -> AsyncIterator[list[str]]:
    servers = await start_servers([0, 0], CHUNKS)
    yield [f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
    for server in servers:
        server.close()


def test_round_robin() -> None:
    rotation = Upstreams(["http://a", "http://b"])
    assert [rotation.target("/x") for _ in range(3)] == ["http://a/x", "http://b/x", "http://a/x"]


async def _check(base: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(base + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200 and (await resp.json())["model"] == MODEL
        async with session.post(base + "/v1/completions", json={**body, "stream": True}) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in resp.content if line.startswith(b"data: ")]
        async with session.get(base + "/health") as resp:
            assert resp.status == 200
    assert len(lines) == CHUNKS + 2 and lines[-1] == b"data: [DONE]\n"
    assert json.loads(lines[0][6:])["choices"][0]["delta"]["content"] == "t1 "


async def test_the_aiohttp_floor(upstreams: list[str]) -> None:
    runner = web.AppRunner(aiohttp_app(upstreams))
    await runner.setup()
    site = web.SockSite(runner, _socket())
    await site.start()
    try:
        await _check(site.name)
    finally:
        await runner.cleanup()


async def test_the_fastapi_floor(upstreams: list[str]) -> None:
    await _serve(uvicorn.Config(fastapi_app(upstreams), log_level="warning", lifespan="on"))


async def test_the_ridge_floor_goes_through_the_front_door(upstreams: list[str]) -> None:
    floor = RidgeFloor(upstreams)
    assert floor.door(b"POST", b"/v1/chat/completions", None) is not None
    assert floor.door(b"GET", b"/v1/chat/completions", None) is None  # the ASGI way
    assert floor.door(b"POST", b"/health", None) is None
    await _serve(uvicorn.Config(floor, log_level="warning", lifespan="on",
                                http=with_limits(HttpLimits(), floor.door)))


async def _serve(config: uvicorn.Config) -> None:
    """Serve ``config``'s app on a free port while :func:`_check` runs against it."""
    sock = _socket()
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        host, port = sock.getsockname()[:2]
        await _check(f"http://{host}:{port}")
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def _socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock
