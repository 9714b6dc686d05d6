"""Direct body writes: a stream's pieces framed and written as uvicorn's own ``send`` would."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.server.protocol import body_writer


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
