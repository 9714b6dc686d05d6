"""The streaming client: TTFT, delivery delays, events, and what counts as an error."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from ridge_bench.harness.upstream import FIRST_CHUNK_S, PACED_MODEL, start_servers
from ridge_bench.overhead.stream_client import _read_line, _Stream, _verdict, run_streams

CHUNKS = 3
PACED = json.dumps({"model": PACED_MODEL, "stream": True}).encode()


@pytest.fixture
async def url() -> AsyncIterator[str]:
    servers = await start_servers([0], CHUNKS)
    port = servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1/chat/completions"
    for server in servers:
        server.close()


async def test_paced_streams_are_timed_and_checked(url: str) -> None:
    result = await run_streams(url, PACED, CHUNKS, concurrency=2, seconds=0.2)
    assert result.error_count == 0 and result.streams >= 2
    assert result.events == result.streams * (CHUNKS + 2)
    assert min(result.ttft_ms) >= FIRST_CHUNK_S * 1000 * 0.9
    assert len(result.delays_ms) == result.streams * CHUNKS and min(result.delays_ms) >= 0


async def test_a_short_stream_is_an_error(url: str) -> None:
    result = await run_streams(url, PACED, CHUNKS + 1, concurrency=1, seconds=0.05)
    assert result.streams == 0 and set(result.errors) == {f"{CHUNKS} of {CHUNKS + 1} chunks"}


async def test_non_200_and_refused_connections_are_errors(unused_tcp_port: int) -> None:
    async def teapot(_: web.Request) -> web.Response:
        return web.Response(status=418)

    app = web.Application()
    app.router.add_post("/", teapot)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        result = await run_streams(f"http://127.0.0.1:{unused_tcp_port}/", PACED, 1, 1, 0.05)
    finally:
        await runner.cleanup()
    assert result.errors["HTTP 418"] >= 1 and result.streams == 0
    refused = await run_streams(f"http://127.0.0.1:{unused_tcp_port}/", PACED, 1, 1, 0.05)
    assert refused.error_count >= 1


def test_lines_and_verdicts() -> None:
    stream = _Stream()
    for line in (b': comment\n', b'data: {"choices":[{"delta":{"content":"a"}}],'
                 b'"x_sent_ns":1000000}\n', b'data: {"choices":[],"usage":{}}\n',
                 b"data: [DONE]\n"):
        _read_line(stream, line, sent_ns=0, now_ns=3_000_000)
    assert (stream.events, stream.content, stream.usage, stream.done) == (3, 1, True, True)
    assert stream.ttft_ms == 3.0 and stream.delays_ms == [2.0]
    assert _verdict(stream, 1) is None and _verdict(stream, 2) == "1 of 2 chunks"
    stream.usage = False
    assert _verdict(stream, 1) == "no usage chunk"
