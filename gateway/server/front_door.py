"""The front door: the engine routes served straight from ridge's HTTP/1.1 protocol, with no
ASGI scope, no message dicts and no request cycle between the parser and the proxy.

:class:`~gateway.server.protocol.RidgeHttpProtocol` asks its ``doors`` (the application's
:meth:`gateway.app.RidgeApp.door`) for every request's method, path and listener. A
:class:`Door` (a ``POST`` to an engine route, on a listener that serves it) takes the request:
the protocol keeps its body in a :class:`DirectExchange` and, once the body is in (or past the
door's limit), runs the door's handler on it as a task. Any other request goes the ASGI way.

A :class:`DirectExchange` stands where uvicorn's request cycle would (``protocol.cycle``), so
the protocol's keep-alive, pipelining, graceful shutdown and limits treat it as one: it has the
cycle's ``response_started``, ``response_complete``, ``keep_alive`` and ``disconnected``, and
calls the protocol's ``on_response_complete`` when its response is out. Its head carries the
server's default headers (``date``, ``server``) as uvicorn's would. See
docs/gateway.md#the-front-door.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.server import ServerState

from gateway.server.exchange import (
    BodyWriter,
    DisconnectWatch,
    Exchange,
    Headers,
    chunk,
    too_large,
)

log = logging.getLogger("ridge.http")

_CHUNKED = b"transfer-encoding: chunked\r\n"
_CLOSE = b"connection: close\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_INTERNAL_ERROR = (b"content-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n"
                   b"connection: close\r\n\r\nInternal Server Error")


@dataclass(frozen=True, slots=True)
class Door:
    """A route the front door serves: its handler and the request body's limit [bytes]."""

    serve: Callable[[Exchange], Awaitable[None]]
    body_limit: int


class Doors(Protocol):
    """Which door a request takes, by its method, path (no query) and the listener's address;
    None: the ASGI way."""

    def __call__(self, method: bytes, path: bytes,
                 server: tuple[str, int | None] | None) -> Door | None: ...


class _Unwaited:
    """uvicorn's protocol sets a cycle's ``message_event`` when the connection is lost; nothing
    waits on a direct exchange's."""

    __slots__ = ()

    def set(self) -> None:
        return None


class DirectExchange:
    """One request through the front door (module docstring): the request's head and body as
    the protocol's callbacks give them, the response written to the connection's transport."""

    __slots__ = ("headers", "transport", "flow", "keep_alive", "disconnected",
                 "response_started", "response_complete", "task", "_door", "_state",
                 "_on_complete", "_loop", "_chunks", "_size", "_too_large", "_watch")
    message_event = _Unwaited()

    def __init__(self, door: Door, headers: Headers, transport: asyncio.Transport,
                 flow: FlowControl, keep_alive: bool, state: ServerState,
                 on_complete: Callable[[], None], loop: asyncio.AbstractEventLoop) -> None:
        self.headers, self.transport, self.flow = headers, transport, flow
        self.keep_alive, self.disconnected = keep_alive, False
        self.response_started = self.response_complete = False
        self._door, self._state, self._on_complete = door, state, on_complete
        self._loop = loop
        self.task: asyncio.Task[None] | None = None
        """The task serving the request, once it runs."""
        self._chunks: list[bytes] = []
        self._size, self._too_large = 0, False
        self._watch = DisconnectWatch()

    # -- what the protocol tells it --------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """A piece of the body; past the door's limit the request is served at once (a 413)
        and the rest of its body dropped."""
        if self._too_large:
            return
        self._size += len(data)
        if self._size > self._door.body_limit:
            self.overflow()
            return
        self._chunks.append(data)

    def overflow(self) -> None:
        """The body is (or is declared) longer than the door's limit."""
        self._too_large = True
        self._chunks.clear()
        self.begin()

    def begin(self) -> None:
        """Run the door's handler (once), now that the body is in or refused."""
        if self.task is not None:
            return
        self.task = task = self._loop.create_task(self._run())
        self._state.tasks.add(task)
        task.add_done_callback(self._state.tasks.discard)

    def lost(self) -> None:
        """The connection is gone; a response not yet complete never will be."""
        if not self.response_complete:
            self.disconnected = True
            self._watch.fire()

    async def _run(self) -> None:
        try:
            await self._door.serve(self)
        except asyncio.CancelledError:
            if not self.response_complete:
                self.transport.close()
            raise
        except Exception:
            log.exception("the front door's handler failed")
            if self.response_started or self.disconnected:
                self.transport.close()
                return
            self.response_started, self.keep_alive = True, False
            self.transport.write(STATUS_LINE[500] + _INTERNAL_ERROR)
            self._complete()
            return
        if not self.response_complete and not self.disconnected:
            log.error("the front door's handler returned without completing its response")
            self.transport.close()

    # -- the Exchange ----------------------------------------------------------------------

    async def body(self, limit: int) -> bytes:
        if self._too_large:
            raise too_large(limit)
        chunks = self._chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def watch(self, gone: Callable[[], None]) -> Callable[[], None]:
        self._watch.on_disconnect(gone)
        return self._watch.clear

    async def respond(self, status: int, headers: Headers, body: bytes) -> None:
        if self.disconnected:
            return
        self.response_started = True
        self.transport.write(b"".join((
            self._head(status, headers), b"content-length: %d\r\n\r\n" % len(body), body)))
        self._complete()

    async def start(self, status: int, headers: Headers) -> BodyWriter | None:
        self.response_started = True
        if not self.disconnected:
            self.transport.write(self._head(status, headers) + _CHUNKED + b"\r\n")
        return BodyWriter(self)

    async def send(self, data: bytes, more: bool) -> None:
        if self.disconnected or self.response_complete:
            return
        if self.flow.write_paused:
            await self.flow.drain()
        piece = chunk(data) if data else b""
        if more:
            if piece:
                self.transport.write(piece)
            return
        self.transport.write(piece + _LAST_CHUNK)
        self._complete()

    # -- the response ----------------------------------------------------------------------

    def _head(self, status: int, headers: Headers) -> bytes:
        """The status line and headers, without the blank line that ends them; a connection
        that will not be kept says so."""
        parts = [STATUS_LINE[status]]
        for name, value in (*self._state.default_headers, *headers):
            parts += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            parts.append(_CLOSE)
        return b"".join(parts)

    def _complete(self) -> None:
        self.response_complete = True
        if not self.keep_alive:
            self.transport.close()
        self._on_complete()
