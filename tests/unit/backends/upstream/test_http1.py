"""ridge's HTTP/1.1 upstream client against a scripted raw-socket server on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from backends.upstream.client import (
    Timeouts,
    UpstreamConnectError,
    UpstreamStreamError,
    UpstreamTimeout,
)
from backends.upstream.http1 import Http1Client, _Slots
from tests.fakes.harness import closed_port_url, ends_without_suspending

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
JSON = {"content-type": "application/json"}
QUICK = Timeouts(connect=2.0, first_byte=2.0, idle=2.0)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request: head and a Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def reply(body: bytes, status: int = 200, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%b\r\n"
            % (status, len(body), extra) + body)


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on a free port; yields its URL and the list of connection ids it accepted."""
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        srv.close()
        await srv.wait_closed()


async def keep_alive_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        request = await read_request(reader)
        body = request.split(b"\r\n\r\n", 1)[1]
        writer.write(reply(b'{"echo": ' + body + b"}"))
        await writer.drain()


async def test_requests_reuse_one_kept_alive_connection() -> None:
    client = Http1Client(QUICK, 8)
    async with server(keep_alive_echo) as (url, conns):
        for i in range(3):
            resp = await client.send(url + "/v1/completions", b"%d" % i, JSON)
            assert resp.status == 200 and resp.headers["content-type"] == "application/json"
            assert await resp.read() == b'{"echo": %d}' % i
            # closing a whole answer awaits nothing (``closes_at_once``: the dispatcher then
            # finishes the request in its own task)
            assert resp.closes_at_once and ends_without_suspending(resp.close())
        assert conns == [0]
    await client.aclose()


async def test_a_chunked_body_arrives_piece_by_piece() -> None:
    gate = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await gate.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    client = Http1Client(QUICK, 8)
    async with server(chunked) as (url, _):
        resp = await client.send(url, b"{}", JSON)
        chunks = resp.chunks()
        assert await anext(chunks) == b"first"  # before the rest was even written
        gate.set()
        assert [c async for c in chunks] == [b"second"]
    await client.aclose()


async def test_pieces_that_arrive_together_are_handed_over_as_one() -> None:
    # three pieces of a chunked body in one write (a stream's events sent back to back): one
    # chunk for the gateway to relay, one write to its client instead of three
    async def together(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n"
                     b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    client = Http1Client(QUICK, 8)
    async with server(together) as (url, _):
        resp = await client.send(url, b"{}", JSON)
        await resp.wait_headers(2.0)  # the body came in the same read: queued already
        assert [c async for c in resp.chunks()] == [b"onetwothree"]
    await client.aclose()


HEAD_AND_TWO = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                b"3\r\none\r\n3\r\ntwo\r\n")


def two_then_rest(gate: asyncio.Event) -> Handler:
    """Per request (kept alive): the head and two pieces at once, the last piece and the end
    once ``gate`` is set."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(HEAD_AND_TWO)
            await writer.drain()
            await gate.wait()
            gate.clear()
            writer.write(b"5\r\nthree\r\n0\r\n\r\n")
            await writer.drain()
    return handler


async def test_a_relay_hands_pieces_over_from_the_callback_and_ends_true() -> None:
    gate = asyncio.Event()
    got: list[bytes] = []

    def take(piece: bytes) -> bool:
        got.append(piece)
        gate.set()  # the rest is written once the first is taken
        return True

    client = Http1Client(QUICK, 8)
    async with server(two_then_rest(gate)) as (url, conns):
        resp = await client.send(url, b"{}", JSON)
        assert await resp.relay(take) is True
        assert got == [b"onetwo", b"three"]  # what was queued, as one; then as it came
        again = await client.send(url, b"{}", JSON)  # the connection was released for reuse
        gate.set()
        assert await again.read() == b"onetwothree" and conns == [0]
    await client.aclose()


async def test_a_consumer_that_cannot_take_more_stops_the_relay_and_the_rest_waits() -> None:
    gate = asyncio.Event()
    got: list[bytes] = []

    def taker(more: bool) -> Callable[[bytes], bool]:
        def take(piece: bytes) -> bool:
            got.append(piece)
            return more
        return take

    client = Http1Client(QUICK, 8)
    async with server(two_then_rest(gate)) as (url, _):
        resp = await client.send(url, b"{}", JSON)
        assert await resp.relay(taker(False)) is False
        gate.set()  # arrives queued, or while the next relay runs: either way handed over
        assert await resp.relay(taker(True)) is True
        assert got == [b"onetwo", b"three"]
    await client.aclose()


async def test_a_relay_ends_with_the_consumers_error_or_the_streams() -> None:
    def refuse(piece: bytes) -> bool:
        raise UpstreamStreamError("an event exceeds the limit")

    async def breaks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD_AND_TWO)
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.transport.abort()

    client = Http1Client(QUICK, 8)
    async with server(two_then_rest(asyncio.Event())) as (url, _):
        resp = await client.send(url, b"{}", JSON)
        with pytest.raises(UpstreamStreamError, match="exceeds"):
            await resp.relay(refuse)
        await resp.close()
    async with server(breaks) as (url, _):
        resp = await client.send(url, b"{}", JSON)
        with pytest.raises(UpstreamStreamError, match="closed"):
            await resp.relay(lambda piece: True)
    await client.aclose()


async def test_a_silent_engine_ends_a_relay_past_the_idle_timeout() -> None:
    client = Http1Client(Timeouts(connect=2.0, first_byte=2.0, idle=0.2), 8)
    async with server(two_then_rest(asyncio.Event())) as (url, _):  # the rest never comes
        resp = await client.send(url, b"{}", JSON)
        with pytest.raises(UpstreamStreamError, match="silent"):
            await resp.relay(lambda piece: True)
    await client.aclose()


async def test_a_stopped_relay_is_cancelled_and_the_rest_is_queued_again() -> None:
    gate = asyncio.Event()
    client = Http1Client(QUICK, 8)
    async with server(two_then_rest(gate)) as (url, _):
        resp = await client.send(url, b"{}", JSON)
        relayed = resp.relay(lambda piece: True)
        resp.stop_relay()  # a cancelled wait gives up on it
        assert relayed.cancelled()
        gate.set()
        assert [c async for c in resp.chunks()] == [b"three"]
    await client.aclose()


async def test_a_pooled_connection_the_engine_closed_is_replaced_once() -> None:
    async def one_per_connection(reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(b"{}"))  # says keep-alive, then closes (its idle timeout)
        await writer.drain()

    client = Http1Client(QUICK, 8)
    async with server(one_per_connection) as (url, conns):
        assert await (await client.send(url, b"{}", JSON)).read() == b"{}"
        await asyncio.sleep(0.05)  # the server's close reaches the pooled connection
        assert await (await client.send(url, b"{}", JSON)).read() == b"{}"
        assert conns == [0, 1]
    await client.aclose()


async def test_refused_and_reset_before_the_answer_are_connect_errors() -> None:
    client = Http1Client(QUICK, 8)
    with pytest.raises(UpstreamConnectError, match="cannot connect"):
        await client.send(closed_port_url(), b"{}", JSON)

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with server(hang_up) as (url, _):
        with pytest.raises(UpstreamConnectError, match="closed before the response"):
            await client.send(url, b"{}", JSON)
    await client.aclose()


async def test_no_headers_in_time_is_a_timeout_and_the_connection_is_dropped() -> None:
    dropped = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # until ridge gives up and closes
        dropped.set()

    client = Http1Client(Timeouts(connect=2.0, first_byte=0.2, idle=2.0), 8)
    async with server(silent) as (url, _):
        with pytest.raises(UpstreamTimeout):
            await client.send(url, b"{}", JSON)
        await asyncio.wait_for(dropped.wait(), 5)
    await client.aclose()


async def test_silence_mid_body_and_a_broken_body_are_stream_errors() -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        await asyncio.sleep(5)

    async def breaks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()

    client = Http1Client(Timeouts(connect=2.0, first_byte=2.0, idle=0.2), 8)
    for handler, message in ((stalls, "silent"), (breaks, "closed")):
        async with server(handler) as (url, _):
            resp = await client.send(url, b"{}", JSON)
            with pytest.raises(UpstreamStreamError, match=message):
                await resp.read()
    await client.aclose()


async def test_the_idle_timeout_counts_each_wait_not_the_whole_stream() -> None:
    """Chunks keep coming for longer than the idle timeout: no timeout; then a silence
    longer than it: the stream fails (the one timer per response is re-armed as it goes)."""

    async def trickles(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(15):  # 15 × 0.1 s: longer than the idle timeout in all
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        await asyncio.sleep(10)

    client = Http1Client(Timeouts(connect=2.0, first_byte=2.0, idle=1.0), 8)
    async with server(trickles) as (url, _):
        resp = await client.send(url, b"{}", JSON)
        got = []
        with pytest.raises(UpstreamStreamError, match="silent"):
            async for chunk in resp.chunks():
                got.append(chunk)
        assert b"".join(got) == b"x" * 15
    await client.aclose()


async def test_closing_before_the_end_drops_the_connection_for_the_engine_to_see() -> None:
    seen = asyncio.Event()

    async def streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        assert await reader.read() == b""  # EOF: the client went away
        seen.set()

    client = Http1Client(QUICK, 8)
    async with server(streams) as (url, _):
        resp = await client.send(url, b"{}", JSON)
        assert await anext(resp.chunks()) == b"abc"
        assert ends_without_suspending(resp.close())  # cut short: a drop, nothing to await
        await asyncio.wait_for(seen.wait(), 5)
    await client.aclose()


async def test_the_pool_holds_at_most_max_connections() -> None:
    client = Http1Client(QUICK, 1)
    async with server(keep_alive_echo) as (url, conns):
        first = await client.send(url, b"1", JSON)
        second = asyncio.ensure_future(client.send(url, b"2", JSON))
        await asyncio.sleep(0.1)
        assert not second.done()  # waits for the one connection
        assert await first.read() == b'{"echo": 1}'
        assert await (await second).read() == b'{"echo": 2}'
        assert conns == [0]
    await client.aclose()


async def test_a_connect_past_its_timeout_is_a_connect_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*_: object, **__: object) -> None:
        await asyncio.sleep(30)

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", never)
    client = Http1Client(Timeouts(connect=0.1, first_byte=2.0, idle=2.0), 8)
    with pytest.raises(UpstreamConnectError, match="connect timed out after 0.1 s"):
        await client.send("http://127.0.0.1:9/v1/completions", b"{}", JSON)
    await client.aclose()


async def test_slots_go_first_come_first_served_and_a_cancelled_wait_takes_none() -> None:
    slots = _Slots(1)
    await slots.acquire()
    order: list[str] = []

    async def take(name: str) -> None:
        await slots.acquire()
        order.append(name)

    gone, first, second = (asyncio.ensure_future(take(n)) for n in ("gone", "first", "second"))
    await asyncio.sleep(0)
    gone.cancel()  # cancelled while waiting: leaves the queue
    await asyncio.sleep(0)
    slots.release()
    await asyncio.sleep(0)
    assert order == ["first"] and not second.done()
    slots.release()
    second.cancel()  # handed the slot, cancelled before it ran: the slot is free again
    await asyncio.sleep(0)
    assert second.cancelled() and order == ["first"]
    await asyncio.wait_for(slots.acquire(), 1)  # the freed slot, at once
    await asyncio.gather(gone, first, second, return_exceptions=True)


async def test_a_malformed_answer_is_an_error_not_a_hang() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    client = Http1Client(QUICK, 8)
    async with server(garbage) as (url, _):  # before the head: the request may go elsewhere
        with pytest.raises(UpstreamConnectError, match="did not answer HTTP/1.1"):
            await client.send(url, b"{}", JSON)
    await client.aclose()
