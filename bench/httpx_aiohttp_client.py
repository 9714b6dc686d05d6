"""A bench-only :class:`backends.client.BackendClient`: httpx's API over aiohttp's I/O.

``httpx.AsyncClient(transport=httpx_aiohttp.AiohttpTransport(client=session))``, where
``session`` is an ``aiohttp.ClientSession`` set up as ridge's own aiohttp transport sets up its
pool (one ``TCPConnector`` of ``max_connections``, TCP_NODELAY sockets, no decompression).
Responses are wrapped by ridge's :class:`backends.httpx_client.HttpxResponse`, so only the
I/O layer differs from ridge's httpx transport. Needs the PyPI package ``httpx-aiohttp``,
which is not a ridge dependency: the transport benchmark measures whether it should become one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from backends.client import Timeouts, UpstreamConnectError, UpstreamTimeout, nodelay_socket
from backends.httpx_client import HttpxResponse


class HttpxAiohttpClient:
    """BackendClient over httpx.AsyncClient with the httpx-aiohttp transport."""

    def __init__(self, timeouts: Timeouts, max_connections: int) -> None:
        self._timeouts = timeouts
        connector = aiohttp.TCPConnector(
            limit=max_connections, limit_per_host=0, socket_factory=nodelay_socket
        )
        session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        self._client = httpx.AsyncClient(
            transport=AiohttpTransport(client=session),
            timeout=httpx.Timeout(connect=timeouts.connect, read=None, write=None, pool=None),
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
