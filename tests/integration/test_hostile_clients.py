"""Hostile clients and misbehaving engines, over real sockets, against a real ``ridge serve``.

Every case asserts the status, the OpenAI error shape, that no engine address appears in what
the client gets, and that ridge serves a normal request right after; the module ends by
checking ridge's RSS and open file descriptors (from ``/proc``) against stated bounds and its
log for tracebacks. Timeouts are set short for the test (2 s); the checks wait for them with
generous bounds, never a tight deadline. Counts are bounded (at most 300 connections at once,
at most ~16 MiB sent per connection).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes.engine import FakeEngine
from tests.real_engine.servers import Server, start_ridge, stop_all, write_fleet

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

TIMEOUT_S = 2.0  # the header and body timeouts ridge runs with here
WAIT_S = 30.0  # how long a check waits for something that should take ~TIMEOUT_S
MIB = 1024 * 1024
RSS_GROWTH_MIB = 60  # allowed growth of ridge's RSS over the whole module
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 16384}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


class Ridge:
    def __init__(self, server: Server, good: FakeEngine, odd: FakeEngine) -> None:
        self.server, self.good, self.odd = server, good, odd
        self.host, self.port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
        self.rss0 = rss_mib(server.process.pid)

    @property
    def pid(self) -> int:
        return self.server.process.pid


@pytest.fixture(scope="module")
async def ridge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Ridge]:
    tmp = tmp_path_factory.mktemp("hostile")
    good, odd = FakeEngine(model="m"), FakeEngine(model="odd")
    pools = [{"name": name, "engine": "vllm", "models": [fake.model], "model": FACTS,
              "hardware": L4, "endpoints": [await fake.start()]}
             for name, fake in (("main", good), ("odd", odd))]
    fleet = write_fleet({"pools": pools}, tmp / "fleet.yaml")
    env = {"RIDGE_HTTP__HEADER_TIMEOUT_S": str(TIMEOUT_S),
           "RIDGE_HTTP__BODY_TIMEOUT_S": str(TIMEOUT_S),
           "RIDGE_UPSTREAM__MAX_RESPONSE_BYTES": str(MIB),
           "RIDGE_UPSTREAM__MAX_EVENT_BYTES": str(MIB),
           "RIDGE_UPSTREAM__RETRIES": "0",
           "RIDGE_REGISTRY__POLL_INTERVAL_S": "0.2"}
    server = await asyncio.to_thread(start_ridge, fleet, tmp, "ridge", env)
    try:
        yield Ridge(server, good, odd)
    finally:
        await asyncio.to_thread(stop_all, [server])
        await good.stop()
        await odd.stop()


# -- helpers -------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the one response on ``reader`` (read to EOF)."""
    raw = await asyncio.wait_for(reader.read(), WAIT_S)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), raw[:200]
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def openai_error(body: bytes, status: int) -> dict[str, Any]:
    """The error object of an OpenAI-shaped error body, checked; no engine address in it."""
    assert b"127.0.0.1" not in body and b"Traceback" not in body, body[:300]
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("invalid_request_error" if status < 500 else error["type"])
    return dict(error)


async def raw_request(ridge: Ridge, data: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection(ridge.host, ridge.port)
    try:
        writer.write(data)
        await writer.drain()
        return await answer(reader)
    finally:
        writer.close()


async def post(ridge: Ridge, body: dict[str, Any] | bytes,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session, \
            session.post(ridge.server.url + "/v1/chat/completions", data=data,
                         headers={"content-type": "application/json", **(headers or {})}) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()


async def still_serves(ridge: Ridge) -> None:
    status, headers, body = await post(ridge, CHAT)
    assert status == 200, body[:300]
    assert headers["x-request-id"]


def request_head(extra: bytes = b"", length: int | None = None) -> bytes:
    size = b"" if length is None else b"content-length: %d\r\n" % length
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: ridge\r\n"
            b"content-type: application/json\r\n" + size + extra)


# -- what clients send ---------------------------------------------------------------------


async def test_ten_thousand_headers_get_431(ridge: Ridge) -> None:
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(10_000))
    status, headers, body = await raw_request(ridge, request_head(many, 2) + b"\r\n{}")
    assert status == 431 and headers["connection"] == "close"
    assert openai_error(body, status)["code"] == "request_header_fields_too_large"
    await still_serves(ridge)


async def _send_huge_header(ridge: Ridge, size: int) -> tuple[int, int]:
    """Send one header of ``size`` bytes in 64 KiB writes until ridge answers or closes;
    (status, bytes sent)."""
    reader, writer = await asyncio.open_connection(ridge.host, ridge.port)
    sent = 0
    try:
        writer.write(request_head() + b"x-huge: ")
        while sent < size:
            writer.write(b"a" * 65536)
            sent += 65536
            try:
                await asyncio.wait_for(writer.drain(), WAIT_S)
            except (ConnectionError, TimeoutError):
                break
            if reader.at_eof() or reader._buffer:  # type: ignore[attr-defined]
                break
        status, _, body = await answer(reader)
        openai_error(body, status)
        return status, sent
    finally:
        writer.close()


async def test_a_16_mib_header_gets_431_without_being_held(ridge: Ridge) -> None:
    status, sent = await _send_huge_header(ridge, 16 * MIB)
    assert status == 431 and sent < 16 * MIB  # refused part-way, not after reading it all
    await still_serves(ridge)


async def test_ten_unfinished_16_mib_headers_at_once_keep_memory_bounded(ridge: Ridge) -> None:
    before = rss_mib(ridge.pid)
    results = await asyncio.gather(*(_send_huge_header(ridge, 16 * MIB) for _ in range(10)))
    assert [status for status, _ in results] == [431] * 10
    assert rss_mib(ridge.pid) - before < 40  # not 10 × 16 MiB
    await still_serves(ridge)


async def test_slowloris_headers_get_408(ridge: Ridge) -> None:
    reader, writer = await asyncio.open_connection(ridge.host, ridge.port)
    try:
        writer.write(request_head())
        for i in range(int(WAIT_S)):  # one header a second, never the end of the head
            if reader.at_eof() or reader._buffer:  # type: ignore[attr-defined]
                break
            writer.write(b"x-slow-%d: v\r\n" % i)
            await writer.drain()
            await asyncio.sleep(1.0)
        status, _, body = await answer(reader)
    finally:
        writer.close()
    assert status == 408 and openai_error(body, status)["code"] == "request_timeout"
    await still_serves(ridge)


async def test_a_declared_body_that_never_arrives_gets_408(ridge: Ridge) -> None:
    status, _, body = await raw_request(ridge, request_head(length=1000) + b'\r\n{"model"')
    assert status == 408 and openai_error(body, status)["code"] == "request_timeout"
    await still_serves(ridge)


async def test_connections_that_never_send_a_byte_are_closed(ridge: Ridge) -> None:
    before = open_fds(ridge.pid)
    conns = [await asyncio.open_connection(ridge.host, ridge.port) for _ in range(300)]
    try:
        ends = await asyncio.gather(*(asyncio.wait_for(r.read(), WAIT_S) for r, _ in conns))
        assert ends == [b""] * 300  # closed by ridge, nothing answered
    finally:
        for _, writer in conns:
            writer.close()
    for _ in range(int(WAIT_S * 10)):
        if open_fds(ridge.pid) <= before + 5:
            break
        await asyncio.sleep(0.1)
    assert open_fds(ridge.pid) <= before + 5
    await still_serves(ridge)


@pytest.mark.parametrize("body", [
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 5000
    + b"]" * 5000 + b"}",
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": ' + b"9" * 5000
    + b"}",
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1' + b"0" * 30
    + b"}",
])
async def test_deep_json_and_huge_integers_get_400(ridge: Ridge, body: bytes) -> None:
    status, _, answered = await post(ridge, body)
    assert status == 400 and openai_error(answered, status)
    await still_serves(ridge)


async def test_other_methods_get_405_with_allow(ridge: Ridge) -> None:
    status, headers, body = await raw_request(
        ridge, b"GET /v1/chat/completions HTTP/1.1\r\nhost: ridge\r\nconnection: close\r\n\r\n")
    assert status == 405 and headers["allow"] == "POST" and openai_error(body, status)


async def test_a_client_leaving_mid_upload_costs_nothing(ridge: Ridge) -> None:
    for _ in range(5):
        reader, writer = await asyncio.open_connection(ridge.host, ridge.port)
        writer.write(request_head(length=5000) + b'\r\n{"model": "m", "mess')
        await writer.drain()
        writer.close()
    await still_serves(ridge)


async def test_a_request_id_is_echoed_or_made(ridge: Ridge) -> None:
    _, mine, _ = await post(ridge, CHAT, {"x-request-id": "client-42"})
    _, made, _ = await post(ridge, CHAT, {"x-request-id": "bad id\twith spaces"})
    assert mine["x-request-id"] == "client-42" and made["x-request-id"].startswith("req-")


# -- what engines answer -------------------------------------------------------------------


ODD = {"model": "odd", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def odd(ridge: Ridge) -> AsyncIterator[FakeEngine]:
    """The misbehaving engine, answering normally again and taken back by ridge after the
    test (an endpoint marked failed comes back at its next good poll)."""
    yield ridge.odd
    ridge.odd.mode = "ok"
    for _ in range(int(WAIT_S * 10)):
        if (await post(ridge, ODD))[0] == 200:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the odd engine was not taken back")


@pytest.mark.parametrize("mode", ["garbage", "status_999"])
async def test_an_engine_that_does_not_answer_http_gets_a_502(ridge: Ridge, odd: FakeEngine,
                                                              mode: str) -> None:
    odd.mode = mode
    status, headers, body = await post(ridge, ODD)
    assert status == 502 and openai_error(body, status)["code"] == "upstream_unreachable"
    assert headers["x-request-id"]
    await still_serves(ridge)


async def test_an_engine_body_past_the_cap_gets_a_502(ridge: Ridge, odd: FakeEngine) -> None:
    odd.mode, odd.huge_bytes = "huge", 4 * MIB
    status, _, body = await post(ridge, ODD)
    assert status == 502 and openai_error(body, status)["code"] == "upstream_broken"


async def test_an_endless_event_ends_the_stream_with_an_error_event(ridge: Ridge,
                                                                    odd: FakeEngine) -> None:
    odd.mode, odd.huge_bytes = "huge", 4 * MIB
    status, _, body = await post(ridge, {**ODD, "stream": True})
    assert status == 200  # the stream had started
    last = body.rstrip().split(b"\n\n")[-1]
    assert last.startswith(b"data: ") and b"127.0.0.1" not in last
    assert json.loads(last[6:])["error"]["code"] == "upstream_broken"


# -- what all of it cost (runs last: the module's tests run in file order) -----------------


async def test_memory_fds_and_log_stay_clean(ridge: Ridge) -> None:
    await still_serves(ridge)
    assert rss_mib(ridge.pid) - ridge.rss0 < RSS_GROWTH_MIB
    assert open_fds(ridge.pid) < 100
    log = ridge.server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]
