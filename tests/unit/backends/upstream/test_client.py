from __future__ import annotations

import asyncio
import socket

from backends.upstream.aiohttp_transport import AiohttpClient, AiohttpResponse
from backends.upstream.client import Timeouts, nodelay_socket, relaying
from backends.upstream.http1 import Http1Client, _Connection, _Response
from tests.fakes.harness import ends_without_suspending


def test_upstream_sockets_have_nodelay() -> None:
    info = socket.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)[0]
    sock = nodelay_socket(info)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()


async def test_only_a_response_with_both_relay_methods_is_relaying() -> None:
    class Both:
        def relay(self, consumer: object) -> None: ...

        def stop_relay(self) -> None: ...

    class RelayOnly:
        def relay(self, consumer: object) -> None: ...

    class Attribute:
        relay = stop_relay = None

    both = Both()
    found: object = relaying(both)
    assert found is both
    assert relaying(RelayOnly()) is None and relaying(Attribute()) is None
    client = Http1Client(Timeouts(connect=1.0, first_byte=1.0, idle=1.0), 1)
    http1 = _Response(_Connection(("127.0.0.1", 1), asyncio.get_running_loop()), client)
    found = relaying(http1)
    assert found is http1
    assert relaying(AiohttpResponse.__new__(AiohttpResponse)) is None


async def test_an_aiohttp_response_closes_without_suspending_at_the_end_or_before() -> None:
    """What its ``closes_at_once`` says: aiohttp's release and close are plain calls. The
    server answers the first request whole, the second with its body left open."""
    whole = True

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the body, b"{}"
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ntransfer-encoding: chunked\r\n"
                     b"\r\n3\r\nabc\r\n" + (b"0\r\n\r\n" if whole else b""))
        await writer.drain()
        await reader.read()
        writer.close()

    srv = await asyncio.start_server(answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    client = AiohttpClient(Timeouts(connect=10.0, first_byte=10.0, idle=10.0), 4)
    try:
        for whole in (True, False):
            resp = await client.send(url, b"{}", {"content-type": "application/json"})
            assert await anext(resp.chunks()) == b"abc"
            if whole:
                assert [c async for c in resp.chunks()] == []
            assert resp.closes_at_once and ends_without_suspending(resp.close())
    finally:
        await client.aclose()
        srv.close()
        await srv.wait_closed()
