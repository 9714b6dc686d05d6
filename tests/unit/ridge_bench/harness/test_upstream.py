"""The engine stand-in: its answers, stream shapes and pacing, over real loopback sockets."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from backends.engines.dialects import dialect_for
from backends.engines.scrape import normalise
from ridge_bench.harness.upstream import (
    FIRST_CHUNK_S,
    INTER_CHUNK_S,
    METRICS,
    MODEL,
    PACED_MODEL,
    _content_length,
    start_servers,
)

CHUNKS = 4


@pytest.fixture
async def url() -> AsyncIterator[str]:
    servers = await start_servers([0], CHUNKS)
    yield f"http://127.0.0.1:{servers[0].sockets[0].getsockname()[1]}"
    for server in servers:
        server.close()


def _body(model: str, stream: bool) -> dict[str, object]:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


async def _events(resp: aiohttp.ClientResponse) -> list[tuple[float, bytes]]:
    return [(time.monotonic(), line) async for line in resp.content
            if line.startswith(b"data: ")]


async def test_a_non_streamed_completion_and_keep_alive(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # one connection, three requests
            async with session.post(url + "/v1/chat/completions",
                                    json=_body(MODEL, False)) as resp:
                assert resp.status == 200
                answer = await resp.json()
        assert answer["choices"][0]["message"]["content"] == "ok"


async def test_a_back_to_back_stream_is_whole(url: str) -> None:
    async with aiohttp.ClientSession() as session, \
            session.post(url + "/v1/completions", json=_body(MODEL, True)) as resp:
        assert resp.headers["content-type"] == "text/event-stream"
        lines = [line for _, line in await _events(resp)]
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert len(lines) == CHUNKS + 2 and lines[-1] == b"data: [DONE]\n"
    assert [c["choices"][0]["delta"]["content"] for c in chunks[:CHUNKS]] == \
        [f"t{k} " for k in range(1, CHUNKS + 1)]
    assert all(isinstance(c["x_sent_ns"], int) for c in chunks[:CHUNKS])
    assert chunks[-1]["usage"]["completion_tokens"] == CHUNKS


async def test_a_paced_stream_keeps_its_schedule(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        sent = time.monotonic()
        async with session.post(url + "/v1/chat/completions",
                                json=_body(PACED_MODEL, True)) as resp:
            events = await _events(resp)
    assert len(events) == CHUNKS + 2
    assert events[0][0] - sent >= FIRST_CHUNK_S * 0.9
    assert events[CHUNKS - 1][0] - sent >= (FIRST_CHUNK_S + (CHUNKS - 1) * INTER_CHUNK_S) * 0.9


async def test_health_models_and_metrics_a_poller_can_read(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/health") as resp:
            assert resp.status == 200
        async with session.get(url + "/v1/models") as resp:
            assert {m["id"] for m in (await resp.json())["data"]} == {MODEL, PACED_MODEL}
        async with session.get(url + "/metrics") as resp:
            page = await resp.text()
        async with session.get(url + "/nope") as resp:
            assert resp.status == 404
    metrics = normalise(page, dialect_for("vllm"))
    assert metrics.running == 0 and metrics.kv_block_size == 16
    assert page.encode() == METRICS


async def test_pipelined_requests_are_answered_in_order(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(_body(MODEL, False)).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    writer.write(request + b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 5.0)
    writer.close()
    assert data.count(b"HTTP/1.1 200 OK") == 2 and data.endswith(b"ok")


@pytest.mark.parametrize(("head", "length"), [
    (b"post / http/1.1\r\ncontent-length: 12\r\nhost: x", 12),
    (b"post / http/1.1\r\nhost: x\r\ncontent-length:7", 7),
    (b"get / http/1.1\r\nhost: x", 0),
    (b"post / http/1.1\r\ncontent-length: x", 0),
])
def test_content_length(head: bytes, length: int) -> None:
    assert _content_length(head) == length
