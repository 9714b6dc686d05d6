"""A bench-only :class:`backends.client.BackendClient`: httpx's API over aiohttp's I/O.

``httpx.AsyncClient(transport=httpx_aiohttp.AiohttpTransport(client=session))``, where
``session`` is an ``aiohttp.ClientSession`` set up as ridge's own aiohttp transport sets up its
pool (one ``TCPConnector`` of ``max_connections``, TCP_NODELAY sockets, no decompression).
It is ridge's :class:`backends.httpx_client.HttpxClient` with that transport, so only the
I/O layer differs from ridge's httpx transport. Needs the PyPI package ``httpx-aiohttp``,
which is not a ridge dependency: the transport benchmark measures whether it should become one.
"""

from __future__ import annotations

import aiohttp
from httpx_aiohttp import AiohttpTransport

from backends.client import Timeouts, nodelay_socket
from backends.httpx_client import HttpxClient


def HttpxAiohttpClient(timeouts: Timeouts, max_connections: int) -> HttpxClient:  # noqa: N802
    """BackendClient over httpx.AsyncClient with the httpx-aiohttp transport."""
    connector = aiohttp.TCPConnector(
        limit=max_connections, limit_per_host=0, socket_factory=nodelay_socket
    )
    session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
    return HttpxClient(timeouts, max_connections, AiohttpTransport(client=session))
