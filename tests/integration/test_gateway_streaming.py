"""Streams relayed as they arrive, client disconnects cancelling the engine's work, and the
first routing spreading load."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import aiohttp
import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from tests.fakes.engine import FakeEngine
from tests.fakes.harness import RunningRidge, fleet_of, quick_settings, running_ridge

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _wait_for(predicate: object, timeout_s: float) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


async def test_chunks_are_relayed_as_they_arrive(engines: list[FakeEngine], transport: str) -> None:
    engine = engines[0]
    engine.tokens, engine.token_interval_s = 10, 0.1
    settings = quick_settings(upstream={"transport": transport})
    async with (
        running_ridge(fleet_of({"p": [engine.url]}), settings) as ridge,
        aiohttp.ClientSession() as s,
    ):
        arrivals: list[float] = []
        started = time.monotonic()
        async with s.post(ridge.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            async for line in r.content:
                if line.startswith(b"data: {"):
                    arrivals.append(time.monotonic() - started)
    # 1 role chunk + 10 content chunks + 1 finish chunk, paced 100 ms apart upstream.
    assert len(arrivals) == 12
    content = arrivals[1:11]
    gaps = [b - a for a, b in zip(content, content[1:], strict=False)]
    # relayed one by one: the first token long before the end, and no gap collapses to 0 the
    # way a buffered relay would, nor stalls the way Nagle + delayed ACK would (~40 ms extra).
    assert arrivals[1] < 0.6 and arrivals[-1] > 0.9
    assert all(0.05 < g < 0.2 for g in gaps), gaps


async def test_client_leaving_a_stream_stops_the_engine(
    engines: list[FakeEngine], transport: str
) -> None:
    engine = engines[0]
    engine.tokens, engine.token_interval_s = 1000, 0.02
    settings = quick_settings(upstream={"transport": transport})
    async with running_ridge(fleet_of({"p": [engine.url]}), settings) as ridge:
        async with (
            aiohttp.ClientSession() as s,
            s.post(ridge.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r,
        ):
            await r.content.readline()
            assert await _wait_for(lambda: engine.running == 1, 2)
        # the client closed its connection mid-stream
        assert await _wait_for(lambda: engine.running == 0, 3), "engine still generating"
        assert await _settled(ridge)
        assert (
            ridge.metrics.get_sample_value(
                "ridge_requests_total", {"model": "m", "pool": "p", "status": "499"}
            )
            == 1
        )
    assert engine.served == 0


def _send_buffer_max() -> int:
    """The kernel's largest TCP send buffer [bytes]: what ridge's socket can hold before its
    own buffer fills (4 MiB when unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


async def test_a_client_reading_slowly_holds_the_relay_back_and_loses_nothing(
    engines: list[FakeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twice the kernel's largest send buffer in events from the engine at once, to a client
    that reads nothing for a while through a small socket buffer: the relay stops when the
    client's buffer fills and waits for it to drain (so ridge holds a bounded amount), and
    every event arrives."""
    engine = engines[0]
    engine.tokens = tokens = 2 * _send_buffer_max() // 150  # events of over 150 bytes each
    drains = 0
    drain = FlowControl.drain  # the client connection's (the relay's writer is compiled)

    async def counted(flow: FlowControl) -> None:
        nonlocal drains
        drains += 1
        await drain(flow)

    monkeypatch.setattr(FlowControl, "drain", counted)
    body = json.dumps({**CHAT, "stream": True}).encode()
    async with running_ridge(fleet_of({"p": [engine.url]})) as ridge:
        port = int(ridge.url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n"
                     b"connection: close\r\n\r\n%b" % (len(body), body))
        await writer.drain()
        assert await _wait_for(lambda: engine.served == 1 or drains > 0, 10)
        await asyncio.sleep(0.5)  # the client reads nothing yet
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    assert drains > 0  # the relay waited for the client at least once
    words = [line for line in answer.split(b"\n") if b'"content": "' in line]
    assert len(words) == 1 + tokens  # the role chunk's, then every word
    assert b"data: [DONE]" in answer and answer.endswith(b"\r\n0\r\n\r\n")  # the body's end


async def test_client_leaving_a_non_streaming_request_stops_the_engine(
    engines: list[FakeEngine],
    transport: str,
) -> None:
    engine = engines[0]
    engine.tokens, engine.token_interval_s = 1000, 0.02  # a 20 s answer
    settings = quick_settings(upstream={"transport": transport})
    async with running_ridge(fleet_of({"p": [engine.url]}), settings) as ridge:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as s:
            with pytest.raises(TimeoutError):
                async with s.post(ridge.url + "/v1/chat/completions", json=CHAT) as r:
                    await r.read()
        assert await _wait_for(lambda: engine.running == 0, 3), "engine still generating"
        assert await _settled(ridge)
    assert engine.served == 0


async def test_least_loaded_endpoint_takes_the_next_request(engines: list[FakeEngine]) -> None:
    for e in engines:
        e.tokens, e.token_interval_s = 20, 0.02
    async with (
        running_ridge(fleet_of({"p": [e.url for e in engines]})) as ridge,
        aiohttp.ClientSession() as s,
    ):

        async def one() -> None:
            async with s.post(ridge.url + "/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
                await r.read()

        await asyncio.gather(*(one() for _ in range(8)))
    assert sorted(e.served for e in engines) == [4, 4]


async def _settled(ridge: RunningRidge) -> bool:
    def idle() -> bool:
        return not ridge.gateway.state.in_flight()

    return await _wait_for(idle, 3)
