"""The floors of the overhead benchmark: bare pass-through gateways with no routing, no
telemetry and no parsing, so ridge can be compared with the web stack it is built on.

``python -m ridge_bench.overhead.passthrough --server NAME --port P --upstream URL ...``
listens on 127.0.0.1:P and forwards every ``POST /v1/chat/completions`` and
``/v1/completions`` body unchanged to the next upstream in turn (round robin over
``--upstream``), through one shared aiohttp client session (unbounded pool, keep-alive;
``ridge``: ridge's own client).
A JSON answer is read whole and returned with the upstream's status; an event stream is
relayed chunk by chunk as it arrives (``iter_any``), never decoded. ``GET /health`` is 200.

- ``fastapi``: a FastAPI app with one ``async def`` route under uvicorn (uvloop, httptools,
  no access log): the stack ridge's edge is written in.
- ``aiohttp``: an aiohttp.web app on uvloop (no access log).
- ``ridge``: ridge's own transport with nothing of its request logic: its HTTP/1.1 protocol
  and front door (:mod:`gateway.server.front_door`) in front of its pooled upstream client
  (:mod:`backends.upstream.http1`), under uvicorn's server loop as ``ridge serve`` runs them;
  a stream is relayed from the engine connection's callback, as ridge's proxy relays it.
  What ridge's request path costs beyond this floor is its parsing, admission, routing and
  telemetry.
- ``asgi-uvicorn``, ``asgi-granian``: one bare ASGI callable (no framework) under uvicorn
  (uvloop, httptools, ridge's choice) and under granian (its ASGI interface, uvloop, one
  worker, one runtime thread): the same app on two HTTP servers, to compare the servers alone.

All run on uvloop, which sets TCP_NODELAY on every TCP connection (ridge's client sets it
too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping, Sequence
from functools import partial
from itertools import cycle
from types import MappingProxyType

import aiohttp
import uvicorn
from aiohttp import web
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from backends.upstream.client import relaying
from gateway.app import default_client
from gateway.request.proxy import BodyLimits
from gateway.server.exchange import Exchange
from gateway.server.front_door import Door
from gateway.server.protocol import HttpLimits, with_limits
from gateway.settings import UpstreamSettings
from ridge_bench.harness.upstream import run_loop

Message = MutableMapping[str, object]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
UPSTREAMS_ENV = "RIDGE_BENCH_UPSTREAMS"
"""Where :func:`asgi_app_from_env` (granian's app factory) reads the upstreams (space-separated)."""

PATHS = ("/v1/chat/completions", "/v1/completions")
_JSON = {"content-type": "application/json"}
_SSE = "text/event-stream"


def client_session() -> aiohttp.ClientSession:
    """The upstream session: no pool limit, no total timeout (streams may be long)."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    return aiohttp.ClientSession(connector=connector,
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))


class Upstreams:
    """The upstream base URLs in round-robin order, and the session to reach them."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._next = cycle(list(urls)).__next__
        self.session: aiohttp.ClientSession | None = None

    def target(self, path: str) -> str:
        return self._next() + path

    def open(self) -> aiohttp.ClientSession:
        self.session = client_session()
        return self.session


def fastapi_app(urls: Sequence[str]) -> FastAPI:
    """The FastAPI floor (module doc)."""
    upstreams = Upstreams(urls)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with upstreams.open():
            yield

    app = FastAPI(lifespan=lifespan)

    async def relay(request: Request) -> Response:
        assert upstreams.session is not None
        body = await request.body()
        resp = await upstreams.session.post(upstreams.target(request.url.path), data=body,
                                            headers=_JSON)
        if resp.content_type == _SSE:
            return StreamingResponse(_chunks(resp), status_code=resp.status, media_type=_SSE)
        async with resp:
            data = await resp.read()
        return Response(data, status_code=resp.status, media_type=resp.content_type)

    async def health() -> Response:
        return Response(b"ok", media_type="text/plain")

    for path in PATHS:
        app.add_api_route(path, relay, methods=["POST"])
    app.add_api_route("/health", health, methods=["GET"])
    return app


async def _chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    async with resp:
        async for chunk in resp.content.iter_any():
            yield chunk


def aiohttp_app(urls: Sequence[str]) -> web.Application:
    """The aiohttp.web floor (module doc)."""
    upstreams = Upstreams(urls)

    async def session_ctx(_: web.Application) -> AsyncIterator[None]:
        async with upstreams.open():
            yield

    async def relay(request: web.Request) -> web.StreamResponse:
        assert upstreams.session is not None
        body = await request.read()
        async with upstreams.session.post(upstreams.target(request.path), data=body,
                                          headers=_JSON) as resp:
            if resp.content_type != _SSE:
                return web.Response(body=await resp.read(), status=resp.status,
                                    content_type=resp.content_type)
            out = web.StreamResponse(status=resp.status, headers={"content-type": _SSE})
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    for path in PATHS:
        app.router.add_post(path, relay)
    app.router.add_get("/health", health)
    return app


class BareAsgi:
    """The bare ASGI pass-through (module doc): lifespan opens the session; every POST is
    forwarded; an event stream is relayed as it arrives."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.upstreams = Upstreams(urls)

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._relay(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.upstreams.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.upstreams.session is not None:
                    await self.upstreams.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _relay(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await _answer(send, 200, "text/plain", b"ok")
            return
        body, more = b"", True
        while more:
            message = await receive()
            chunk = message.get("body", b"")
            body += chunk if isinstance(chunk, bytes) else b""
            more = bool(message.get("more_body"))
        session = self.upstreams.session
        assert session is not None
        async with session.post(self.upstreams.target(str(scope["path"])), data=body,
                                headers=_JSON) as resp:
            if resp.content_type != _SSE:
                await _answer(send, resp.status, resp.content_type, await resp.read())
                return
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", _SSE.encode())]})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


class RidgeFloor:
    """The ``ridge`` floor (module doc): every ``POST`` to :data:`PATHS` through a front door
    to the next upstream in turn; anything else is answered ``ok`` the ASGI way."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._next = cycle(list(urls)).__next__
        self.client = default_client(UpstreamSettings())  # ridge's, with its defaults
        self._limit = BodyLimits().request
        self._doors = {path.encode(): Door(partial(self.relay, path=path), self._limit)
                       for path in PATHS}

    def door(self, method: bytes, path: bytes,
             server: tuple[str, int | None] | None) -> Door | None:
        return self._doors.get(path) if method == b"POST" else None

    async def relay(self, exchange: Exchange, path: str) -> None:
        body = await exchange.body(self._limit)
        resp = await self.client.send(self._next() + path, body, _JSON)
        media = resp.headers.get("content-type", "application/json")
        if not media.startswith(_SSE):
            data = await resp.read()
            await exchange.respond(resp.status, [(b"content-type", media.encode())], data)
            return
        writer = await exchange.start(resp.status, [(b"content-type", _SSE.encode())])
        relayed = relaying(resp)
        assert writer is not None and relayed is not None  # the front door's, ridge's client
        try:  # relayed from the engine connection's callback, as ridge's proxy relays
            while not await relayed.relay(writer.write):
                if writer.gone:
                    return
                await writer.drain()
        finally:
            relayed.stop_relay()
        await exchange.send(b"", more=False)

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await self.client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
        elif scope["type"] == "http":
            await _answer(send, 200, "text/plain", b"ok")


def serve_ridge(port: int, urls: Sequence[str]) -> None:
    app = RidgeFloor(urls)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop",
                            http=with_limits(HttpLimits(), app.door), log_level="warning",
                            access_log=False, lifespan="on", backlog=4096)
    uvicorn.Server(config).run()


async def _answer(send: Send, status: int, content_type: str, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode())]})
    await send({"type": "http.response.body", "body": body})


def asgi_app_from_env() -> BareAsgi:
    """granian's app factory: the bare ASGI app over the upstreams in :data:`UPSTREAMS_ENV`."""
    return BareAsgi(os.environ[UPSTREAMS_ENV].split())


def serve_asgi_uvicorn(port: int, urls: Sequence[str]) -> None:
    config = uvicorn.Config(BareAsgi(urls), host="127.0.0.1", port=port, loop="uvloop",
                            http="httptools", log_level="warning", access_log=False,
                            lifespan="on", backlog=4096)
    uvicorn.Server(config).run()


def serve_asgi_granian(port: int, urls: Sequence[str]) -> None:
    from granian.constants import Interfaces, Loops
    from granian.server import Server

    os.environ[UPSTREAMS_ENV] = " ".join(urls)
    Server("ridge_bench.overhead.passthrough:asgi_app_from_env", address="127.0.0.1", port=port,
           interface=Interfaces.ASGI, workers=1, runtime_threads=1, loop=Loops.uvloop,
           backlog=4096, log_enabled=False, factory=True).serve()


async def serve_aiohttp(port: int, urls: Sequence[str]) -> None:
    runner = web.AppRunner(aiohttp_app(urls), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def serve_fastapi(port: int, urls: Sequence[str]) -> None:
    config = uvicorn.Config(fastapi_app(urls), host="127.0.0.1", port=port, loop="uvloop",
                            http="httptools", log_level="warning", access_log=False,
                            lifespan="on", backlog=4096)
    uvicorn.Server(config).run()


SERVERS: Mapping[str, Callable[[int, Sequence[str]], None]] = MappingProxyType({
    "fastapi": serve_fastapi, "ridge": serve_ridge, "asgi-uvicorn": serve_asgi_uvicorn,
    "asgi-granian": serve_asgi_granian})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ridge_bench.overhead.passthrough",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True,
                        choices=("fastapi", "aiohttp", "ridge", "asgi-uvicorn",
                                 "asgi-granian"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", nargs="+", required=True, help="upstream base URLs")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        if args.server == "aiohttp":
            run_loop(serve_aiohttp(args.port, args.upstream))
        else:
            SERVERS[args.server](args.port, args.upstream)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
