"""gateway.server.front_door through ridge's protocol: a request a door takes is served from the
parser's callbacks, its response framed as uvicorn's cycle frames one, and the connection's
keep-alive, pipelining, limits and disconnects work as they do the ASGI way."""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
from uvicorn.server import ServerState

from backends.sim import virtual_loop
from gateway.server.errors import GatewayError
from gateway.server.exchange import Exchange
from gateway.server.front_door import Door
from gateway.server.protocol import HttpLimits, RidgeHttpProtocol, with_limits

CHAT = b"/v1/chat/completions"
Handler = Callable[[Exchange], Awaitable[None]]


class Connection(asyncio.Transport):
    """A client's connection: what the server writes, and when it was closed [s]."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop, self.written, self.closed_at = loop, bytearray(), math.inf

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed_at < math.inf

    def close(self) -> None:
        self.closed_at = min(self.closed_at, self.loop.time())

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Server:
    """ridge's protocol on one connection, its doors serving ``CHAT`` with ``handler``, every
    other request going to an ASGI app that answers ``asgi``."""

    def __init__(self, handler: Handler, limit: int = 1024, keep_alive_s: int = 5,
                 limits: HttpLimits | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.door = Door(handler, limit)
        self.asked: list[tuple[bytes, bytes]] = []
        self.scopes: list[Any] = []
        config = uvicorn.Config(app=self.app, log_config=None, lifespan="off", interface="asgi3",
                                timeout_keep_alive=keep_alive_s)
        config.load()
        self.state = ServerState()
        self.state.default_headers = [(b"date", b"Thu, 03 Dec 2026 00:00:00 GMT"),
                                      (b"server", b"uvicorn")]
        cls = with_limits(limits or HttpLimits(), self.doors)
        self.protocol: RidgeHttpProtocol = cls(config, self.state, {}, _loop=self.loop)
        self.connection = Connection(self.loop)
        self.protocol.connection_made(self.connection)

    def doors(self, method: bytes, path: bytes,
              server: tuple[str, int | None] | None) -> Door | None:
        self.asked.append((method, path))
        return self.door if method == b"POST" and path == CHAT else None

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"asgi"})

    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    async def settle(self) -> None:
        for _ in range(100):
            await asyncio.sleep(0)

    @property
    def written(self) -> bytes:
        return bytes(self.connection.written)


def post(body: bytes = b'{"model":"m"}', path: bytes = CHAT, extra: bytes = b"") -> bytes:
    return (b"POST %b?x=1 HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%b\r\n%b" % (path, len(body), extra, body))


def responses(written: bytes) -> list[bytes]:
    """Each response's status line, in order."""
    return re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", written)


async def echo(exchange: Exchange) -> None:
    body = await exchange.body(1024)
    names = b",".join(name for name, _ in exchange.headers)
    await exchange.respond(200, [(b"content-type", b"application/json"),
                                 (b"x-names", names)], body)


async def test_a_door_serves_the_request_whole_and_keeps_the_connection() -> None:
    server = Server(echo)
    server.send(post())
    await server.settle()
    head, _, body = server.written.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK" and body == b'{"model":"m"}'
    assert b"content-length: 13" in lines and b"x-names: host,content-type,content-length" in lines
    assert any(line.startswith(b"date: ") for line in lines)  # the server's default headers
    assert b"connection: close" not in lines and not server.connection.is_closing()
    assert server.asked == [(b"POST", CHAT)] and server.scopes == []  # no ASGI scope built
    assert server.state.total_requests == 1
    server.send(post(b'{"model":"n"}'))  # the same connection serves the next one
    await server.settle()
    assert server.written.endswith(b'{"model":"n"}') and server.state.total_requests == 2


async def test_other_requests_go_the_asgi_way_with_a_disconnect_watch() -> None:
    server = Server(echo)
    server.send(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
    server.send(post(path=b"/v1/other"))
    await server.settle()
    assert responses(server.written) == [b"HTTP/1.1 200 OK"] * 2
    assert server.written.count(b"asgi") == 2
    assert all("ridge.disconnect" in scope["extensions"] for scope in server.scopes)
    assert server.scopes[0]["path"] == "/v1/models" and server.scopes[1]["method"] == "POST"


async def test_a_stream_is_framed_as_uvicorns_cycle_frames_it() -> None:
    async def stream(exchange: Exchange) -> None:
        writer = await exchange.start(200, [(b"content-type", b"text/event-stream")])
        assert writer is not None
        assert writer.write(b"data: 1\n\n")
        await exchange.send(b"data: 2\n\n", more=True)
        await exchange.send(b"data: [DONE]\n\n", more=False)

    server = Server(stream)
    server.send(post())
    await server.settle()
    theirs = Connection(server.loop)
    log = logging.getLogger("test")
    scope: Any = {"type": "http", "method": "POST", "path": "/", "headers": []}
    cycle = RequestResponseCycle(scope, theirs, FlowControl(theirs), log, log, False,
                                 list(server.state.default_headers), asyncio.Event(), False,
                                 True, lambda: None)
    await cycle.send({"type": "http.response.start", "status": 200,
                      "headers": [(b"content-type", b"text/event-stream")]})
    for piece, more in ((b"data: 1\n\n", True), (b"data: 2\n\n", True),
                        (b"data: [DONE]\n\n", False)):
        await cycle.send({"type": "http.response.body", "body": piece, "more_body": more})
    assert server.written == bytes(theirs.written)
    assert server.written.endswith(b"0\r\n\r\n") and server.state.total_requests == 1


@pytest.mark.parametrize("declared", [True, False])
async def test_a_body_past_the_limit_is_refused_before_the_rest_arrives(declared: bool) -> None:
    seen: list[str] = []

    async def handler(exchange: Exchange) -> None:
        try:
            await exchange.body(10)
        except GatewayError as exc:
            seen.append(exc.code or "")
            await exchange.respond(exc.status, [], b"{}")

    server = Server(handler, limit=10)
    if declared:
        server.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                    b"content-length: 11\r\n\r\n")
    else:
        server.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                    b"transfer-encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n12345678\r\n")
    await server.settle()
    assert seen == ["request_too_large"]
    assert responses(server.written) == [b"HTTP/1.1 413 Request Entity Too Large"]


async def test_a_client_that_leaves_fires_the_watch_and_gets_nothing() -> None:
    gone = asyncio.Event()
    release = asyncio.Event()

    async def handler(exchange: Exchange) -> None:
        exchange.watch(gone.set)
        await release.wait()
        await exchange.respond(200, [], b"late")

    server = Server(handler)
    server.send(post())
    await server.settle()
    server.protocol.connection_lost(None)
    await asyncio.wait_for(gone.wait(), 5)
    release.set()
    await server.settle()
    assert server.written == b""


async def test_pipelined_requests_are_answered_in_order() -> None:
    release = asyncio.Event()

    async def slow(exchange: Exchange) -> None:
        await release.wait()
        await exchange.respond(200, [], b"first")

    server = Server(slow)
    server.send(post() + b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
    await server.settle()
    assert server.written == b""  # the second waits for the first
    release.set()
    await server.settle()
    written = server.written
    assert written.index(b"first") < written.index(b"asgi")
    assert server.state.total_requests == 2


async def test_a_connection_asked_to_close_is_closed_after_its_answer() -> None:
    server = Server(echo)
    server.send(post(extra=b"connection: close\r\n"))
    await server.settle()
    assert b"\r\nconnection: close\r\n" in server.written
    assert server.connection.is_closing()


async def test_a_failing_handler_is_a_500_that_closes_the_connection(
        caplog: pytest.LogCaptureFixture) -> None:
    async def broken(exchange: Exchange) -> None:
        raise RuntimeError("boom")

    server = Server(broken)
    server.send(post())
    await server.settle()
    assert responses(server.written) == [b"HTTP/1.1 500 Internal Server Error"]
    assert server.connection.is_closing() and "front door" in caplog.text


async def test_expect_100_continue_is_answered_before_the_body() -> None:
    server = Server(echo)
    server.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n"
                b"expect: 100-continue\r\n\r\n")
    assert server.written == b"HTTP/1.1 100 Continue\r\n\r\n"
    server.send(b"{}")
    await server.settle()
    assert server.written.endswith(b"\r\n\r\n{}")


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout() -> None:
    """After a direct answer the protocol's own timer closes the idle connection (virtual
    time), where uvicorn arms a timer per response."""

    async def run() -> tuple[float, float]:
        server = Server(echo, keep_alive_s=5, limits=HttpLimits(header_timeout_s=30.0))
        server.send(post())
        await asyncio.sleep(3)
        server.send(post())  # a second request keeps it busy: the idle time starts again
        answered = server.loop.time()
        await asyncio.sleep(60)
        return answered, server.connection.closed_at

    answered, closed = virtual_loop.run(run())
    assert closed == pytest.approx(answered + 5, abs=0.01)


def test_a_stalled_body_behind_the_door_is_a_408_and_the_handler_never_runs() -> None:
    ran: list[bool] = []

    async def handler(exchange: Exchange) -> None:
        ran.append(True)

    async def stall() -> Server:
        server = Server(handler, limits=HttpLimits(header_timeout_s=30.0, body_timeout_s=5.0))
        server.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                    b"content-length: 100\r\n\r\n{\"model\"")
        await asyncio.sleep(40)
        server.protocol.connection_lost(None)
        return server

    server = virtual_loop.run(stall())
    assert responses(server.written) == [b"HTTP/1.1 408 Request Timeout"]
    assert server.connection.closed_at == pytest.approx(5.0) and ran == []
