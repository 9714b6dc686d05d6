"""ridge's HTTP/1.1 server protocol: uvicorn's httptools protocol, plus the front door, a
disconnect watch and the limits a gateway exposed to anyone must enforce.

- The front door (:mod:`gateway.server.front_door`): a request its ``doors`` take is served
  without ASGI; every other goes through uvicorn's request cycle to the ASGI application.
- A :class:`~gateway.server.exchange.DisconnectWatch` in every ASGI request's scope
  (``scope["extensions"]["ridge.disconnect"]``), fired when the connection is lost before the
  response is complete.
- :func:`body_writer`: a :class:`~gateway.server.exchange.BodyWriter` for uvicorn's ``send``,
  so a relay in the upstream connection's callback writes a chunked body's pieces straight to
  the client's transport (None under any other server, or a wrapped ``send``).
- :class:`HttpLimits`: a head past ``max_header_bytes`` or ``max_header_count`` is a 431, a
  head or body that stalls past ``header_timeout_s`` / ``body_timeout_s`` [s] a 408, an
  unparsable one a 400; then the connection closes lingering (:data:`LINGER_S`). One timer per
  connection, not per request.

Selected with ``uvicorn.Config(http=with_limits(limits, doors))``
(:func:`gateway.cli.main.uvicorn_config`). See docs/gateway.md#the-http-protocol.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.server.errors import error_body
from gateway.server.exchange import WATCH, BodyWriter, DisconnectWatch, declared_too_large
from gateway.server.front_door import DirectExchange, Door, Doors

log = logging.getLogger("ridge.http")

_IDLE, _HEAD, _BODY, _APP = range(4)  # what the connection is waiting for
LINGER_S = 2.0  # [s] how long a refused connection drains what the client still sends


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one client connection may send (module docstring). Sizes in bytes, times in s."""

    max_header_bytes: int = 64 * 1024
    max_header_count: int = 100
    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if min(self.max_header_bytes, self.max_header_count) < 1 or \
                min(self.header_timeout_s, self.body_timeout_s) <= 0:
            raise ValueError("HTTP limits must be positive")


def body_writer(send: Callable[..., object]) -> BodyWriter | None:
    """A :class:`BodyWriter` for the response ``send`` sends, when ``send`` is uvicorn's own
    and the response's head went out with a chunked body still open; else None."""
    cycle = getattr(send, "__self__", None)
    if not isinstance(cycle, RequestResponseCycle) or not cycle.response_started or \
            not cycle.chunked_encoding or cycle.response_complete:
        return None
    return BodyWriter(cycle)


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that broke a limit."""


class RidgeHttpProtocol(HttpToolsProtocol):  # uvicorn internals: test_protocol_pins.py
    """uvicorn's httptools protocol with the front door of :attr:`doors` (None: none), a
    :class:`DisconnectWatch` per ASGI request and the limits of :attr:`limits` (module
    docstring)."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    doors: ClassVar[Doors | None] = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._phase = _IDLE
        self._deadline = self.loop.time() + self.limits.header_timeout_s
        self._timer: asyncio.TimerHandle | None = self.loop.call_at(self._deadline,
                                                                    self._on_timer)
        self._head_bytes = self._head_count = 0
        self._refusal: tuple[int, str, str] | None = None
        self._lingering: asyncio.TimerHandle | None = None
        self._direct: DirectExchange | None = None

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # refused: what the client still sends is read and dropped
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            log.debug("refused a request: %s", self._refusal or exc)
            self._refuse(*(self._refusal or (400, "invalid HTTP/1.1 request",
                                             "invalid_http_request")))
            return
        if self._phase == _HEAD:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(*self._too_large())

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        """uvicorn's, but the ASGI scope is built once the head is in, only for a request
        that goes the ASGI way (:meth:`_asgi_scope`)."""
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._head_bytes = self._head_count = 0
        self._expect(_HEAD, self.limits.header_timeout_s)

    def _asgi_scope(self) -> None:
        """The scope uvicorn's ``on_message_begin`` builds, with a :class:`DisconnectWatch`."""
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1", "server": self.server, "client": self.client,
            "scheme": self.scheme, "root_path": self.root_path, "headers": self.headers,
            "state": self.app_state.copy(), "extensions": {WATCH: DisconnectWatch()}}
        self.scope = scope  # type: ignore[assignment]

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if self._head_count > self.limits.max_header_count:
            self._refusal = self._too_large()
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._expect(_BODY, self.limits.body_timeout_s)
        door = self._door()
        if door is None:
            self._asgi_scope()
            super().on_headers_complete()
            return
        parser = self.parser
        direct = DirectExchange(
            door, self.headers, self.transport, self.flow,
            parser.get_http_version() != "1.0" and parser.should_keep_alive(),
            self.server_state, self._direct_complete, self.loop)
        self.cycle = self._direct = direct  # type: ignore[assignment]
        if declared_too_large(self.headers, door.body_limit):
            direct.overflow()
        elif self.expect_100_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _direct_complete(self) -> None:
        """uvicorn's ``on_response_complete`` for a direct exchange, but an idle connection is
        closed by this protocol's own timer (:meth:`_expect`), not by a timer per response."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._expect(_IDLE, self.timeout_keep_alive)

    def _door(self) -> Door | None:
        """The front door this request takes, if any: not while an earlier response on this
        connection is still going out (pipelined requests queue the ASGI way), nor for an
        upgrade or a URL that is not a plain path."""
        doors = self.doors
        if doors is None or (self.cycle is not None and not self.cycle.response_complete) \
                or self.parser.should_upgrade():
            return None
        path = self.url.partition(b"?")[0]
        if not path.startswith(b"/"):
            return None
        return doors(self.parser.get_method(), path, self.server)

    def on_body(self, body: bytes) -> None:
        self._deadline = self.loop.time() + self.limits.body_timeout_s
        cycle: object = self.cycle
        if type(cycle) is DirectExchange:
            cycle.feed(body)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._phase = _APP
        cycle: object = self.cycle
        if type(cycle) is DirectExchange:
            cycle.begin()
            return
        super().on_message_complete()

    # -- limits --------------------------------------------------------------------------

    def _expect(self, phase: int, timeout_s: float) -> None:
        """Wait for ``phase`` at most ``timeout_s`` from now. A pending timer due by then is
        kept (it re-arms itself for the new deadline when it fires); one due later (a body
        timeout shorter than the header timeout) is replaced."""
        self._phase = phase
        self._deadline = self.loop.time() + timeout_s
        if self._timer is not None and self._timer.when() > self._deadline:
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._timer = self.loop.call_at(self._deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._phase == _APP or self.transport.is_closing():
            return
        if self.loop.time() < self._deadline:
            self._timer = self.loop.call_at(self._deadline, self._on_timer)
        elif self._phase == _IDLE:
            self.transport.close()  # a connection that never sent a byte: nothing to answer
        elif self._phase == _HEAD:
            self._refuse(408, f"request headers not received within "
                              f"{self.limits.header_timeout_s:g} s", "request_timeout")
        else:
            self._refuse(408, f"request body stalled for {self.limits.body_timeout_s:g} s",
                         "request_timeout")

    def _too_large(self) -> tuple[int, str, str]:
        return (431, f"request headers exceed the limit of {self.limits.max_header_count} "
                     f"headers or {self.limits.max_header_bytes} bytes",
                "request_header_fields_too_large")

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer ``status`` (unless a response is already under way) and close: at once if
        nothing was answered, else after a lingering close (our side shut for writing, what
        the client still sends dropped, for at most :data:`LINGER_S`), so that the answer is
        not destroyed by a reset while the client is still sending."""
        self._phase = _APP
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self.transport.close()
            return
        if cycle is not None:  # this is the answer: the handler's own is not wanted
            cycle.response_started = cycle.response_complete = True
        body = json.dumps(error_body(status, message, code=code)).encode()
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
                "connection: close\r\n\r\n").encode("ascii")
        self.transport.write(head + body)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.flow.resume_reading()
        self._lingering = self.loop.call_later(LINGER_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        for handle in (self._timer, self._lingering):
            if handle is not None:
                handle.cancel()
        self._timer = None
        cycles = [self.cycle, *(cycle for cycle, _ in self.pipeline)] if self.cycle else []
        super().connection_lost(exc)
        if self._direct is not None:
            self._direct.lost()
        for cycle in cycles:
            if isinstance(cycle, RequestResponseCycle) and not cycle.response_complete:
                watch = cycle.scope.get("extensions", {}).get(WATCH)
                if isinstance(watch, DisconnectWatch):
                    watch.fire()


def with_limits(limits: HttpLimits, doors: Doors | None = None) -> type[RidgeHttpProtocol]:
    """:class:`RidgeHttpProtocol` enforcing ``limits``, with the front door of ``doors`` (None:
    every request goes the ASGI way); uvicorn builds one per connection."""

    class Limited(RidgeHttpProtocol):
        pass

    Limited.limits = limits
    Limited.doors = staticmethod(doors) if doors is not None else None
    return Limited
