"""ridge's own upstream transport, the default (``RIDGE_UPSTREAM__TRANSPORT=http1``): a lean
HTTP/1.1 client on asyncio protocols.

An engine speaks plain HTTP/1.1 with keep-alive to ridge, so the client only keeps a pool of
open connections per engine, writes one request (headers and body in one write: a ``POST``,
or the ``GET`` of a probe's page), parses the response with httptools (status line, headers,
``Content-Length`` or chunked bodies) and hands the body over as it arrives, whatever is
waiting as one piece.

- Pool: idle connections per (host, port), last in first out, at most ``max_connections`` in
  all; reused only after a complete keep-alive response. A reused connection the engine had
  closed is retried once on a new one.
- Timeouts ``connect``, ``first_byte``, ``idle``, normalised into the errors of
  :mod:`backends.upstream.client`; back-pressure past :data:`HIGH_WATER` bytes.
- Relay (:meth:`_Response.relay`): a consumer may take each piece in the connection's own
  callback, with no task wake-up per piece.

Compiled with the request path (:data:`gateway.native.COMPILED`): its classes are plain ones
(asyncio and uvloop call a protocol's methods by name; it needs no base class). See
docs/backends.md#the-default-transport-http1.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, Final, cast
from urllib.parse import urlsplit

import httptools

from backends.upstream.client import (
    Timeouts,
    UpstreamConnectError,
    UpstreamStreamError,
    UpstreamTimeout,
    too_large,
)

HIGH_WATER = 256 * 1024  # [bytes] unread body held before the socket stops being read


class _Target:
    """Where a URL's requests go: the socket's host and port, and the request head's lead
    of a ``POST`` (request line, ``host`` header, up to the ``content-length`` value),
    encoded once."""

    def __init__(self, host: str, port: int, path: str, host_header: bytes) -> None:
        self.host: Final = host
        self.port: Final = port
        self.key: Final = (host, port)  # the pool's key for its idle connections
        self.path: Final = path.encode("ascii")
        self.host_header: Final = host_header
        self.lead: Final = b"".join((b"POST ", self.path, b" HTTP/1.1\r\nhost: ",
                                     host_header, b"\r\ncontent-length: "))


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UpstreamConnectError(f"not an http:// URL: {url!r}")
    port = parts.port or 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target(parts.hostname, port, path, parts.netloc.encode("ascii"))


class _Connection:
    """One upstream connection and the response it is reading (an asyncio protocol; httptools
    parser callbacks)."""

    def __init__(self, key: tuple[str, int], loop: asyncio.AbstractEventLoop) -> None:
        self.key, self.loop = key, loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: _Response | None = None
        self.lost = False
        self.reused = False
        self.got_bytes = False

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response = self.response
            if response is not None and not response.headers_done:
                response.fail_headers(f"the engine did not answer HTTP/1.1: {exc}")
            else:
                self._fail(UpstreamStreamError(f"malformed response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        response = self.response
        if response is not None and not response.complete:
            if not response.headers_done:
                response.fail_headers(f"connection closed before the response: "
                                      f"{exc or 'by the engine'}")
            else:
                self._fail(UpstreamStreamError(f"connection closed: {exc or 'by the engine'}"))

    def eof_received(self) -> bool:
        return False  # the transport closes itself: connection_lost follows

    def pause_writing(self) -> None:
        pass  # requests are written whole, and small

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:  # a repeated header: the last one counts
            self.response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.response is not None:
            self.response.headers_complete(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response.feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None:
            response.finished(self.parser.should_keep_alive())

    # -- the pool's side -----------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        if self.response is not None:
            self.response.fail(exc)

    def reusable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Response:
    """An upstream response: headers as soon as they arrive, the body as it arrives."""

    def __init__(self, conn: _Connection, pool: Http1Client) -> None:
        self.closes_at_once: Final = True  # close releases or drops the connection at once
        self._conn, self._pool = conn, pool
        self.headers: dict[str, str] = {}  # lower-case names, as they arrive
        self.status = 0
        self.headers_done = False
        self.complete = False
        self._keep_alive = False
        self._loop = conn.loop  # (asyncio.get_running_loop() is a getpid() system call)
        self._head: asyncio.Future[None] = self._loop.create_future()
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        self._released = False
        self._idle: asyncio.TimerHandle | None = None
        self._waiting_since = 0.0
        self._relay: Callable[[bytes], bool] | None = None
        self._relayed: asyncio.Future[bool] | None = None

    # -- fed by the connection -----------------------------------------------------------

    def headers_complete(self, status: int) -> None:
        self.status, self.headers_done = status, True
        if not self._head.done():
            self._head.set_result(None)

    def fail_headers(self, why: str) -> None:
        """No response head will come: a connect error (the request may go elsewhere)."""
        if not self._head.done():
            self._head.set_exception(UpstreamConnectError(why))

    def feed(self, data: bytes) -> None:
        if self._relay is not None:
            self._hand_over(self._relay, data)
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER and self._conn.transport is not None:
            self._conn.transport.pause_reading()
        self._wake()

    def finished(self, keep_alive: bool) -> None:
        self.complete, self._keep_alive = True, keep_alive
        self._wake()

    def fail(self, exc: Exception) -> None:
        if self._error is None:
            self._error = exc
        if not self._head.done():
            self._head.set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        if self._relayed is not None and (self.complete or self._error is not None):
            self._end_relay(None)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the UpstreamResponse protocol ----------------------------------------------------

    async def wait_headers(self, timeout_s: float) -> None:
        """Until the response's headers arrive; :class:`UpstreamTimeout` after ``timeout_s``
        (a timer that fails the wait: no ``asyncio.timeout`` scope to enter, reschedule and
        leave for every request)."""
        head = self._head
        if head.done():
            return head.result()
        late = self._loop.call_later(timeout_s, self._headers_late, timeout_s)
        try:
            await head
        finally:
            late.cancel()

    def _headers_late(self, timeout_s: float) -> None:
        if not self._head.done():
            self._head.set_exception(UpstreamTimeout(f"no response within {timeout_s:g} s"))

    async def _next(self, idle_s: float) -> bytes | None:
        """The next body chunk; None at the end. A wait longer than ``idle_s`` aborts the
        response (:meth:`_watch_idle`)."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return None
            self._waiter = waiter = self._loop.create_future()
            self._arm_idle(idle_s)
            try:
                await waiter
            finally:
                self._waiter = None
        return self._take_queued()

    def _take_queued(self) -> bytes:
        """Every piece queued, as one (pieces that arrived together: one relay, one write),
        and the socket read again if it was paused."""
        chunks = self._chunks
        chunk = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._conn.transport is not None:
            self._conn.transport.resume_reading()
        return chunk

    def _arm_idle(self, idle_s: float) -> None:
        """A wait starts now: the idle timer is set unless it runs already (:meth:`_watch_idle`
        re-arms it for the wait's own deadline)."""
        self._waiting_since = now = self._loop.time()
        if self._idle is None:
            self._idle = self._loop.call_at(now + idle_s, self._watch_idle, idle_s)

    def relay(self, consumer: Callable[[bytes], bool]) -> asyncio.Future[bool]:
        """Hand the body to ``consumer`` from the connection's callback as it arrives (what
        is queued first, as one piece), until ``consumer`` returns False (it cannot take more
        now: what follows is queued) or the body ends. The future: True at the body's end
        (the connection is released, as at the end of :meth:`chunks`), False when the
        consumer stopped; the stream's error (:class:`UpstreamStreamError`, an idle timeout
        included) or the consumer's own exception when either broke it off. Call
        :meth:`stop_relay` when giving up on it (a cancelled wait)."""
        done: asyncio.Future[bool] = self._loop.create_future()
        self._relayed, self._relay = done, consumer
        if self._chunks:
            self._hand_over(consumer, self._take_queued())
        if not done.done() and (self.complete or self._error is not None):
            self._end_relay(None)
        elif not done.done():
            self._arm_idle(self._pool.timeouts.idle)
        return done

    def stop_relay(self) -> None:
        """Stop handing pieces over (they are queued again); a pending relay is cancelled."""
        done, self._relay, self._relayed = self._relayed, None, None
        if done is not None and not done.done():
            done.cancel()

    def _hand_over(self, consumer: Callable[[bytes], bool], data: bytes) -> None:
        """One piece to the relay's consumer; its refusal or failure ends the relay."""
        self._waiting_since = self._loop.time()
        try:
            more = consumer(data)
        except Exception as exc:  # the consumer's (an event too large, say): the relay's end
            self._end_relay(exc)
            return
        if not more:
            self._end_relay(False)

    def _end_relay(self, outcome: Exception | bool | None) -> None:
        """Settle the relay: ``outcome`` False (the consumer stopped), an exception, or None
        (the body ended, or broke off: its own outcome)."""
        done, self._relay, self._relayed = self._relayed, None, None
        if done is None or done.done():
            return
        if isinstance(outcome, Exception):
            done.set_exception(outcome)
        elif outcome is False:
            done.set_result(False)
        elif self._error is not None:
            done.set_exception(self._error)
        else:
            self._release()
            done.set_result(True)

    def _watch_idle(self, idle_s: float) -> None:
        """The idle timer: one per response, re-armed only when it fires (not for every
        chunk). A wait that has lasted ``idle_s`` fails with :class:`UpstreamStreamError` and
        drops the connection; otherwise the timer is set for the current wait's deadline, or
        left off when nothing waits (the next wait sets it)."""
        self._idle = None
        waiter = self._waiter
        waiting = (waiter is not None and not waiter.done()) or self._relayed is not None
        if not waiting or self._released:
            return
        loop = self._loop
        deadline = self._waiting_since + idle_s
        if loop.time() < deadline:
            self._idle = loop.call_at(deadline, self._watch_idle, idle_s)
            return
        self.abort()
        silent = UpstreamStreamError("upstream went silent past the idle timeout")
        if waiter is not None and not waiter.done():
            waiter.set_exception(silent)
        self._end_relay(silent)

    async def read(self, limit: int | None = None) -> bytes:
        idle = self._pool.timeouts.idle
        parts, size = [], 0
        while (chunk := await self._next(idle)) is not None:
            size += len(chunk)
            if limit is not None and size > limit:
                self.abort()
                raise too_large(limit)
            parts.append(chunk)
        self._release()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def chunks(self) -> AsyncIterator[bytes]:
        return _Chunks(self)

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body; None at its end (the connection is then released)."""
        chunk = await self._next(self._pool.timeouts.idle)
        if chunk is None:
            self._release()
        return chunk

    async def close(self) -> None:
        if self.complete and self._error is None:
            self._release()
        else:
            self.abort()

    def abort(self) -> None:
        """Drop the connection (the engine sees the request go away)."""
        if not self._released:
            self.drop()
            self._pool.returned(self._conn, reuse=False)

    def drop(self) -> None:
        """Close the connection for good, the request's pool slot kept by the caller."""
        self._stop_idle()
        self._relay = None  # nothing more is handed over
        self._released = True
        self._conn.close()
        self._pool.forget(self._conn)

    def _stop_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _release(self) -> None:
        self._stop_idle()
        if not self._released:
            self._released = True
            reuse = self._keep_alive and self._error is None and self._conn.reusable()
            if not reuse:
                self._conn.close()
            self._pool.returned(self._conn, reuse)


class _Chunks:
    """:meth:`_Response.chunks`: the body piece by piece, as an async iterator."""

    def __init__(self, response: _Response) -> None:
        self._response = response

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._response.next_chunk()
        if chunk is None:
            raise StopAsyncIteration
        return chunk


class _Slots:
    """The pool's connection slots: at most ``size`` held at once, waiters served first come,
    first served. Invariant: a slot is free only when nobody waits (a release hands it to the
    first waiter)."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        """Take a free slot now; False when none is free (then :meth:`wait` for one)."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        """A slot: at once when one is free, else the next one released."""
        if not self.take():
            await self.wait()

    async def wait(self) -> None:
        """Until a released slot is handed over (call it only after :meth:`take` failed)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot, then cancelled: the next waiter's
            elif waiter in self._waiters:  # (a release may have dropped it already)
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class Http1Client:
    """:class:`~backends.upstream.client.BackendClient` over pooled HTTP/1.1 connections
    (module doc)."""

    def __init__(self, timeouts: Timeouts, max_connections: int) -> None:
        self.timeouts = timeouts
        self._slots = _Slots(max_connections)
        self._idle: dict[tuple[str, int], list[_Connection]] = {}  # per (host, port), LIFO
        self._open: set[_Connection] = set()
        self._targets: dict[str, _Target] = {}

    def send(self, url: str, body: bytes, headers: Mapping[str, str]
             ) -> Coroutine[Any, Any, _Response]:
        """A ``POST`` of ``body`` to ``url``: the response once its headers are in. (The
        coroutine of :meth:`_exchange`, not one wrapped around it: a request awaits one.)"""
        target = self._target_of(url)
        return self._exchange(target, _request_head(target, headers, len(body)) + body)

    def get(self, url: str, headers: Mapping[str, str]) -> Coroutine[Any, Any, _Response]:
        """A ``GET`` of ``url`` (a probe's page): the response once its headers are in."""
        target = self._target_of(url)
        return self._exchange(target, _get_head(target, headers))

    def _target_of(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _target(url)
            if len(self._targets) > 4096:  # URLs come from the fleet file; bounded anyway
                self._targets.clear()
        return target

    async def _exchange(self, target: _Target, request: bytes) -> _Response:
        """Write ``request`` on a pooled connection to ``target`` (a new one when none is
        idle, or when the pooled one turns out closed) once a slot is free."""
        slots = self._slots
        if not slots.take():  # (no coroutine to await while a slot is free)
            await slots.wait()
        response: _Response | None = None
        try:
            for fresh in (False, True):
                conn = None if fresh else self._pooled(target)
                if conn is None:
                    conn = await self._connect(target)
                response = self._start(conn, request)
                try:
                    await response.wait_headers(self.timeouts.first_byte)
                    return response
                except UpstreamConnectError:
                    # a pooled connection the engine had closed: once more on a new one
                    if fresh or not conn.reused or conn.got_bytes:
                        raise
                    response.drop()
                    response = None
            raise AssertionError("unreachable")
        except BaseException:
            if response is not None:
                response.drop()
            self._slots.release()
            raise

    def _start(self, conn: _Connection, request: bytes) -> _Response:
        response = _Response(conn, self)
        conn.response = response
        assert conn.transport is not None
        conn.transport.write(request)
        return response

    def _pooled(self, target: _Target) -> _Connection | None:
        """An idle connection to ``target`` still open, the last one returned first; None
        when there is none."""
        idle = self._idle.get(target.key)
        while idle:
            conn = idle.pop()
            if conn.reusable():
                conn.reused, conn.got_bytes = True, False
                conn.parser = httptools.HttpResponseParser(conn)
                return conn
            self._open.discard(conn)
        return None

    async def _connect(self, target: _Target) -> _Connection:
        key = target.key
        loop = asyncio.get_running_loop()
        try:  # wait_for, not an asyncio.timeout scope: docs/gateway.md#compiled-modules
            _, made = await asyncio.wait_for(
                loop.create_connection(lambda: _protocol(key, loop), target.host, target.port),
                self.timeouts.connect)
        except TimeoutError as exc:
            raise UpstreamConnectError(f"connect timed out after {self.timeouts.connect:g} s"
                                       ) from exc
        except OSError as exc:
            raise UpstreamConnectError(_describe(exc, target)) from exc
        conn = cast(_Connection, made)
        sock = conn.transport.get_extra_info("socket") if conn.transport else None
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._open.add(conn)
        return conn

    def returned(self, conn: _Connection, reuse: bool) -> None:
        """A response is done with ``conn``: back to the pool, or gone; its slot is free."""
        conn.response = None
        self._slots.release()
        if reuse:
            idle = self._idle.get(conn.key)
            if idle is None:
                idle = self._idle[conn.key] = []
            idle.append(conn)
        else:
            self._open.discard(conn)

    def forget(self, conn: _Connection) -> None:
        """``conn`` is closed for good."""
        conn.response = None
        self._open.discard(conn)

    async def aclose(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()


def _protocol(key: tuple[str, int], loop: asyncio.AbstractEventLoop) -> asyncio.BaseProtocol:
    """A new connection as the loop's ``create_connection`` wants it typed (a protocol is
    called by its methods' names: :class:`_Connection` needs no base class)."""
    return cast(asyncio.BaseProtocol, _Connection(key, loop))


def _request_head(target: _Target, headers: Mapping[str, str], length: int) -> bytes:
    return _head([target.lead, str(length).encode("ascii"), b"\r\n"], headers)


def _get_head(target: _Target, headers: Mapping[str, str]) -> bytes:
    return _head([b"GET ", target.path, b" HTTP/1.1\r\nhost: ", target.host_header, b"\r\n"],
                 headers)


def _head(lines: list[bytes], headers: Mapping[str, str]) -> bytes:
    """A request head: ``lines`` (up to the last line break before the headers), then
    ``headers`` and the blank line."""
    for name, value in headers.items():
        lines += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
    lines.append(b"\r\n")
    return b"".join(lines)


def _describe(exc: OSError, target: _Target) -> str:
    reason = exc.strerror or type(exc).__name__
    return f"cannot connect to {target.host}:{target.port}: {reason}"
