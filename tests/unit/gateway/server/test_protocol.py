"""gateway.server.protocol: direct body writes (a stream's pieces framed and written as
uvicorn's own ``send`` would) and the timeouts of a stalled request."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
from uvicorn.server import ServerState

from backends.sim import virtual_loop
from gateway.server.protocol import HttpLimits, body_writer, with_limits


class Transport(asyncio.Transport):
    """Keeps what is written."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False


def cycle(transport: Transport) -> RequestResponseCycle:
    scope: Any = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
                  "headers": []}
    log = logging.getLogger("test")
    return RequestResponseCycle(scope, transport, FlowControl(transport), log, log, False, [],
                                asyncio.Event(), False, True, lambda: None)


START = {"type": "http.response.start", "status": 200,
         "headers": [(b"content-type", b"text/event-stream")]}


async def test_a_writer_frames_pieces_as_uvicorns_send_does() -> None:
    ours, theirs = Transport(), Transport()
    direct, sent = cycle(ours), cycle(theirs)
    assert body_writer(direct.send) is None  # no head out yet
    for c in (direct, sent):
        await c.send(START)
    writer = body_writer(direct.send)
    assert writer is not None
    for piece in (b"data: 1\n\n", b"data: 2\n\n"):
        assert writer.write(piece) is True
        await sent.send({"type": "http.response.body", "body": piece, "more_body": True})
    for c in (direct, sent):
        await c.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert ours.written == theirs.written and theirs.written.endswith(b"0\r\n\r\n")


async def test_a_full_or_gone_client_stops_the_writer() -> None:
    transport = Transport()
    c = cycle(transport)
    await c.send(START)
    writer = body_writer(c.send)
    assert writer is not None
    c.flow.pause_writing()  # the transport's buffer passed its high-water mark
    assert writer.write(b"data: 1\n\n") is False  # written, but take no more
    drained = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0)
    assert not drained.done()
    c.flow.resume_writing()
    await asyncio.wait_for(drained, 5)
    c.disconnected = True
    before = bytes(transport.written)
    assert writer.write(b"data: 2\n\n") is False and writer.gone
    assert transport.written == before  # nothing written to a client that left


async def test_no_writer_for_another_send_or_a_body_of_known_length() -> None:
    async def send(message: Any) -> None:
        pass

    assert body_writer(send) is None  # another ASGI server's, or a wrapped one
    c = cycle(Transport())
    await c.send({**START, "headers": [(b"content-length", b"2")]})
    assert body_writer(c.send) is None


class Connection(Transport):
    """A client's connection: what ridge writes to it, and when it was closed [s]."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop, self.closed_at = loop, math.inf

    def close(self) -> None:
        self.closed_at = min(self.closed_at, self.loop.time())

    def can_write_eof(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@pytest.mark.parametrize(("header_s", "body_s"), [(30.0, 5.0), (5.0, 30.0)])
def test_a_stalled_body_is_refused_at_the_body_timeout(header_s: float, body_s: float) -> None:
    """Whichever of the two timeouts is the shorter, a body that stalls after its head gets its
    408 when the body timeout set runs out, naming that timeout (on virtual time)."""

    async def stall() -> Connection:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            while (await receive()).get("more_body"):  # the rest never comes
                pass

        loop = asyncio.get_running_loop()
        config = uvicorn.Config(app=app, log_config=None, lifespan="off")
        cls = with_limits(HttpLimits(header_timeout_s=header_s, body_timeout_s=body_s))
        protocol = cls(config, ServerState(), {}, _loop=loop)
        connection = Connection(loop)
        protocol.connection_made(connection)
        protocol.data_received(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
                               b"content-length: 100\r\n\r\n{\"model\"")
        await asyncio.sleep(max(header_s, body_s) + 1)
        protocol.connection_lost(None)
        return connection

    connection = virtual_loop.run(stall())
    assert connection.closed_at == pytest.approx(body_s)
    head, _, body = bytes(connection.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert json.loads(body)["error"]["message"] == f"request body stalled for {body_s:g} s"
