"""One request and its response as the proxy serves them, whatever server carries them.

:class:`Exchange` is what :class:`gateway.request.proxy.Proxy` reads a request from and writes
its answer to: the request's headers, its body (a 413 past the limit, :class:`ClientGone` when
the client leaves), a disconnect watch, a whole response, or a streamed one whose pieces go out
one by one or through a :class:`BodyWriter`. Two carry it: :class:`AsgiExchange`, over any
ASGI server's ``scope``, ``receive`` and ``send``; and the front door's
(:mod:`gateway.server.front_door`), straight on ridge's own protocol's connection.

Invariants: a response's head goes out once, before any piece of its body; after the last
piece nothing more is written; header names are lower-case bytes. See
docs/gateway.md#the-front-door.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.flow_control import FlowControl

from gateway.server.errors import GatewayError

Headers = Sequence[tuple[bytes, bytes]]
JSON_TYPE = b"application/json"
REQUEST_ID_HEADER = b"x-request-id"

WATCH = "ridge.disconnect"
"""The key of the :class:`DisconnectWatch` in an ASGI scope's ``extensions`` (ridge's
protocol puts one in every request's scope)."""


class ClientGone(Exception):
    """The client went away before its request was answered."""


class DisconnectWatch:
    """Calls its callback once, when the request's connection is lost before the response is
    complete, so a handler cancels its engine request without a second task per request. A
    callback set after that is called at once."""

    __slots__ = ("_callback", "fired")

    def __init__(self) -> None:
        self._callback: Callable[[], object] | None = None
        self.fired = False

    def on_disconnect(self, callback: Callable[[], object]) -> None:
        self._callback = callback
        if self.fired:
            callback()

    def clear(self) -> None:
        self._callback = None

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        if self._callback is not None:
            self._callback()


class Connection(Protocol):
    """What a :class:`BodyWriter` writes through: a client's transport, its flow control and
    whether the client left (uvicorn's request cycle and the front door's exchange both)."""

    transport: asyncio.Transport
    flow: FlowControl
    disconnected: bool


class BodyWriter:
    """Writes the pieces of one response's chunked body straight to its client, from any
    callback: a relay running in the engine connection's callback writes without waking the
    request's task."""

    __slots__ = ("_connection",)

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def write(self, data: bytes) -> bool:
        """Write ``data`` (not empty) as one chunk of the body; False when the client cannot
        take more now (await :meth:`drain`) or is gone (then nothing is written)."""
        connection = self._connection
        if connection.disconnected:
            return False
        connection.transport.write(chunk(data))
        return not connection.flow.write_paused

    @property
    def gone(self) -> bool:
        """Whether the client went away."""
        return self._connection.disconnected

    async def drain(self) -> None:
        """Until the client's transport takes writes again (at once when it is gone)."""
        await self._connection.flow.drain()


class Exchange(Protocol):
    """One request and its response (module docstring)."""

    @property
    def headers(self) -> Headers:
        """The request's headers, names lower-case."""

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task serving the request (None outside one)."""

    async def body(self, limit: int) -> bytes:
        """The whole request body; a 413 :class:`GatewayError` past ``limit`` bytes."""

    def watch(self, gone: Callable[[], None]) -> Callable[[], None]:
        """Call ``gone`` when the client leaves before the response is complete; returns
        the function that stops watching."""

    async def respond(self, status: int, headers: Headers, body: bytes) -> None:
        """A whole response: ``headers`` (no length or framing: the exchange adds it) and
        ``body``."""

    async def start(self, status: int, headers: Headers) -> BodyWriter | None:
        """A streamed response's head, its body chunked; the writer for its pieces when the
        server allows direct writes, else None (then :meth:`send` each)."""

    async def send(self, data: bytes, more: bool) -> None:
        """A piece of a started body; ``more`` False: the last one."""


_SIZE_LINES: Final = tuple(b"%x\r\n" % size for size in range(1024))
"""A chunk's size line for each size below 1 KiB (a streamed event's), made once: formatting
one per chunk costs more than the rest of its framing."""


def chunk(data: bytes) -> bytes:
    """``data`` (not empty) framed as one chunk of a chunked body."""
    size = len(data)
    line = _SIZE_LINES[size] if size < 1024 else b"%x\r\n" % size
    return line + data + b"\r\n"


def too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"request body exceeds the limit of {limit} bytes",
                        code="request_too_large")


def declared_too_large(headers: Headers, limit: int) -> bool:
    """Whether the request declares a body longer than ``limit`` bytes (refused at once)."""
    for name, value in headers:
        if name == b"content-length":
            return value.isdigit() and int(value) > limit
    return False


def error_response(exc: GatewayError,
                   request_id: bytes | None = None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """``exc`` as an OpenAI-shaped JSON response: status, headers (a 405 says which method is
    allowed) and body."""
    headers = [(b"content-type", JSON_TYPE), *exc.headers]
    if request_id is not None:
        headers.append((REQUEST_ID_HEADER, request_id))
    if exc.status == 405:
        headers.append((b"allow", b"POST"))
    return exc.status, headers, json.dumps(exc.body()).encode()


async def send_error(send: Send, exc: GatewayError, request_id: bytes | None = None) -> None:
    """:func:`error_response` through an ASGI ``send``."""
    status, headers, body = error_response(exc, request_id)
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, limit: int, declared: bool) -> bytes:
    """An ASGI request's body, refusing more than ``limit`` bytes with a 413 (at once when
    ``declared`` too large; else as it arrives, so it is never held in memory whole)."""
    if declared:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class AsgiExchange:
    """An :class:`Exchange` over an ASGI server's ``scope``, ``receive`` and ``send``.
    ``writer_of``: the direct writer the server offers for a started response's ``send``
    (:func:`gateway.server.protocol.body_writer` for uvicorn's), or None."""

    __slots__ = ("_scope", "_receive", "_send", "_writer_of")

    def __init__(self, scope: Scope, receive: Receive, send: Send,
                 writer_of: Callable[[Send], BodyWriter | None]) -> None:
        self._scope, self._receive, self._send = scope, receive, send
        self._writer_of = writer_of

    @property
    def headers(self) -> Headers:
        headers: Headers = self._scope["headers"]
        return headers

    @property
    def task(self) -> asyncio.Task[None] | None:
        return asyncio.current_task()

    async def body(self, limit: int) -> bytes:
        return await read_body(self._receive, limit, declared_too_large(self.headers, limit))

    def watch(self, gone: Callable[[], None]) -> Callable[[], None]:
        """Through the scope's :class:`DisconnectWatch` where ridge's protocol put one; else a
        task awaiting ``http.disconnect`` (the body is read)."""
        watch = self._scope.get("extensions", {}).get(WATCH)
        if isinstance(watch, DisconnectWatch):
            watch.on_disconnect(gone)
            return watch.clear
        watcher = asyncio.ensure_future(_until_disconnect(self._receive, gone))

        def stop() -> None:
            watcher.cancel()
        return stop

    async def respond(self, status: int, headers: Headers, body: bytes) -> None:
        await self._send({"type": "http.response.start", "status": status,
                          "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await self._send({"type": "http.response.body", "body": body})

    async def start(self, status: int, headers: Headers) -> BodyWriter | None:
        await self._send({"type": "http.response.start", "status": status,
                          "headers": list(headers)})
        return self._writer_of(self._send)

    async def send(self, data: bytes, more: bool) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})


async def _until_disconnect(receive: Receive, gone: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone()
