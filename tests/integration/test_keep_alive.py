"""An idle client connection stays open for ``keep_alive_s`` and is closed after it."""

from __future__ import annotations

import asyncio

from tests.fakes.harness import closed_port_url, fleet_of, quick_settings, running_ridge

REQUEST = b"GET /health HTTP/1.1\r\nHost: ridge\r\nConnection: keep-alive\r\n\r\n"


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    """Send one request on the open connection; its status line."""
    writer.write(REQUEST)
    await writer.drain()
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode()
    length = next(int(line.split(":")[1]) for line in head.split("\r\n")
                  if line.lower().startswith("content-length:"))
    await reader.readexactly(length)
    return head.split("\r\n")[0]


async def test_the_idle_connection_lives_for_keep_alive_s_then_closes() -> None:
    fleet = fleet_of({"p": [closed_port_url()]})
    async with running_ridge(fleet, quick_settings(keep_alive_s=2)) as ridge:
        host, port = ridge.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            assert (await _ask(reader, writer)).startswith("HTTP/1.1 ")
            await asyncio.sleep(1.0)  # idle within keep_alive_s: the same connection serves
            assert (await _ask(reader, writer)).startswith("HTTP/1.1 ")
            loop = asyncio.get_running_loop()
            idle_from = loop.time()
            assert await asyncio.wait_for(reader.read(1), 6) == b""  # then the gateway closes
            assert 1.5 <= loop.time() - idle_from <= 4.0
        finally:
            writer.close()
