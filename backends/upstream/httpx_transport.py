"""The httpx transport for :class:`backends.upstream.client.BackendClient`, an alternative to
:mod:`backends.upstream.http1` (``RIDGE_UPSTREAM__TRANSPORT=httpx``).

Kept as an alternative and as the other side of the past transport benchmark
(``docs/benchmarks/transport.md``): httpx's connection pool does work quadratic in its
connections, so it falls far behind as concurrency grows. One ``httpx.AsyncClient`` is shared by
every request; sockets are created with TCP_NODELAY by asyncio. Timeouts as in
:mod:`backends.upstream.aiohttp_transport`. See docs/backends.md#aiohttp-and-httpx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import httpx

from backends.upstream.client import (
    Timeouts,
    UpstreamConnectError,
    UpstreamTimeout,
    guarded,
    read_capped,
)

_BROKEN = (httpx.HTTPError, OSError)


class HttpxResponse:
    """An httpx streaming response behind the UpstreamResponse protocol."""

    closes_at_once = False  # httpx's aclose awaits its transport

    def __init__(self, resp: httpx.Response, idle_s: float) -> None:
        self._resp = resp
        self._idle_s = idle_s

    @property
    def status(self) -> int:
        return self._resp.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def read(self, limit: int | None = None) -> bytes:
        if limit is not None:
            return await read_capped(self.chunks(), limit)
        return await guarded(self._resp.aread(), self._idle_s, _BROKEN)

    async def chunks(self) -> AsyncIterator[bytes]:
        stream = self._resp.aiter_raw()
        while True:
            try:
                chunk = await guarded(anext(stream), self._idle_s, _BROKEN)
            except StopAsyncIteration:
                return
            yield chunk

    async def close(self) -> None:
        await self._resp.aclose()


class HttpxClient:
    """BackendClient over one shared httpx.AsyncClient."""

    def __init__(
        self,
        timeouts: Timeouts,
        max_connections: int,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``transport``: another I/O layer under httpx's API (default: httpx's own pool)."""
        self._timeouts = timeouts
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=timeouts.connect, read=None, write=None, pool=None),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=transport,
        )

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> HttpxResponse:
        request = self._client.build_request("POST", url, content=body, headers=dict(headers))
        try:
            async with asyncio.timeout(self._timeouts.first_byte):
                resp = await self._client.send(request, stream=True)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"no response within {self._timeouts.first_byte:g} s") from exc
        except (httpx.TransportError, OSError) as exc:
            raise UpstreamConnectError(str(exc) or type(exc).__name__) from exc
        return HttpxResponse(resp, self._timeouts.idle)

    async def aclose(self) -> None:
        await self._client.aclose()
