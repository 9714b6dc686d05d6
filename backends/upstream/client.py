"""The upstream seam: one ``BackendClient.send`` that every transport implements.

``send`` returns as soon as the engine's response headers arrive; the body is then read whole
(``read``) or relayed chunk by chunk as it arrives (``chunks``). Transport failures are
normalised into three errors, so the gateway's retry rules do not depend on the transport:

- :class:`UpstreamConnectError`: refused, reset or closed before the first response byte —
  nothing reached the client yet, so the request may be retried on another endpoint;
- :class:`UpstreamTimeout`: no response headers within the first-byte timeout;
- :class:`UpstreamStreamError`: the body broke off (reset, closed, idle too long) mid-way.

Closing a response before its end closes its connection, which is how an engine learns that
the client went away and stops generating.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

T = TypeVar("T")


class UpstreamError(Exception):
    """Base of the normalised transport errors."""


class UpstreamConnectError(UpstreamError):
    """Refused, reset or closed before the first response byte: safe to retry elsewhere."""


class UpstreamTimeout(UpstreamError):
    """No response headers within the first-byte timeout."""


class UpstreamStreamError(UpstreamError):
    """The response body broke off part-way (reset, closed, or silent past the idle timeout)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``first_byte``: until response headers; ``idle``: longest gap between chunks."""

    connect: float
    first_byte: float
    idle: float


class UpstreamResponse(Protocol):
    """An engine's response whose headers have arrived."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (raises UpstreamStreamError if it breaks off, or when it grows past
        ``limit`` bytes: then the connection is dropped)."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (raises UpstreamStreamError if it breaks off)."""
        ...

    async def close(self) -> None:
        """Release the connection; before the body's end this aborts the request upstream."""
        ...

    @property
    def closes_at_once(self) -> bool:
        """Whether :meth:`close` always runs to its end without suspending (see
        :attr:`routing.state.protocol.RouterState.finishes_at_once`)."""
        ...


class Relaying(Protocol):
    """An :class:`UpstreamResponse` that can also hand its body over from its connection's
    callback, piece by piece as it is parsed (:meth:`backends.upstream.http1._Response.relay`:
    the consumer returns False when it cannot take more; the future says True at the body's
    end, False when the consumer stopped)."""

    def relay(self, consumer: Callable[[bytes], bool]) -> asyncio.Future[bool]: ...

    def stop_relay(self) -> None: ...


def relaying(response: object) -> Relaying | None:
    """``response`` as a :class:`Relaying` one when its class has both methods, else None.
    Two class look-ups: an ``isinstance`` check against a runtime-checkable protocol collects
    the protocol's members in Python on every call, a cost docs/benchmarks/overhead.md
    measures."""
    kind = type(response)
    if callable(getattr(kind, "relay", None)) and callable(getattr(kind, "stop_relay", None)):
        return cast(Relaying, response)
    return None


def too_large(limit: int) -> UpstreamStreamError:
    return UpstreamStreamError(f"the response body exceeds {limit} bytes")


async def read_capped(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """Join ``chunks``, raising :func:`too_large` as soon as they pass ``limit`` bytes."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


class BackendClient(Protocol):
    """One shared connection pool to every engine."""

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        """POST ``body`` to ``url``; returns once the response headers are in."""
        ...

    async def aclose(self) -> None: ...


async def guarded(work: Awaitable[T], idle_s: float,
                  errors: tuple[type[BaseException], ...]) -> T:
    """``work`` within ``idle_s`` seconds; silence past it, or one of the transport's
    ``errors``, becomes :class:`UpstreamStreamError`."""
    try:
        async with asyncio.timeout(idle_s):
            return await work
    except TimeoutError as exc:
        raise UpstreamStreamError("upstream went silent past the idle timeout") from exc
    except errors as exc:
        raise UpstreamStreamError(str(exc) or type(exc).__name__) from exc


def nodelay_socket(addr_info: tuple[object, ...]) -> socket.socket:
    """A TCP socket with Nagle's algorithm off, so small SSE chunks leave at once.

    ``addr_info`` is one entry of ``socket.getaddrinfo``: (family, type, proto, ...).
    """
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    assert isinstance(family, int) and isinstance(kind, int) and isinstance(proto, int)
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
