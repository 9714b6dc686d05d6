"""The aiohttp transport for :class:`backends.upstream.client.BackendClient`, an alternative to
:mod:`backends.upstream.http1` (``RIDGE_UPSTREAM__TRANSPORT=aiohttp``).

One ``aiohttp.ClientSession`` with one ``TCPConnector`` is shared by every request and endpoint;
sockets are created with TCP_NODELAY. Timeouts: ``connect`` for the TCP connect, ``first_byte``
until the response headers, ``idle`` between two body chunks.
See docs/backends.md#aiohttp-and-httpx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import aiohttp

from backends.upstream.client import (
    Timeouts,
    UpstreamConnectError,
    UpstreamTimeout,
    guarded,
    nodelay_socket,
    read_capped,
)

_BEFORE_FIRST_BYTE = (aiohttp.ClientConnectionError, ConnectionError, OSError)
_BROKEN = (aiohttp.ClientError, OSError)


class AiohttpResponse:
    """An aiohttp response behind the UpstreamResponse protocol."""

    closes_at_once = True  # aiohttp's close and release are plain calls

    def __init__(self, resp: aiohttp.ClientResponse, idle_s: float) -> None:
        self._resp = resp
        self._idle_s = idle_s

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def read(self, limit: int | None = None) -> bytes:
        if limit is not None:
            return await read_capped(self.chunks(), limit)
        return await guarded(self._resp.read(), self._idle_s, _BROKEN)

    async def chunks(self) -> AsyncIterator[bytes]:
        while chunk := await guarded(self._resp.content.readany(), self._idle_s, _BROKEN):
            yield chunk

    async def close(self) -> None:
        if not self._resp.closed and not self._resp.content.at_eof():
            self._resp.close()  # drops the connection: the engine sees the client leave
        else:
            self._resp.release()


class AiohttpClient:
    """BackendClient over one shared aiohttp session."""

    def __init__(self, timeouts: Timeouts, max_connections: int) -> None:
        self._timeouts = timeouts
        connector = aiohttp.TCPConnector(
            limit=max_connections, limit_per_host=0, socket_factory=nodelay_socket
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
            auto_decompress=False,
        )

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> AiohttpResponse:
        try:
            async with asyncio.timeout(self._timeouts.first_byte):
                resp = await self._session.post(url, data=body, headers=dict(headers))
        except aiohttp.ConnectionTimeoutError as exc:  # a TimeoutError too: test it first
            raise UpstreamConnectError(f"connect timed out: {exc}") from exc
        except TimeoutError as exc:
            raise UpstreamTimeout(f"no response within {self._timeouts.first_byte:g} s") from exc
        except _BEFORE_FIRST_BYTE as exc:
            raise UpstreamConnectError(_describe(exc)) from exc
        return AiohttpResponse(resp, self._timeouts.idle)

    async def aclose(self) -> None:
        await self._session.close()


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
