"""The floors of the overhead benchmark: bare pass-through gateways with no routing, no
telemetry and no parsing, so ridge can be compared with the web stack it is built on.

``python -m ridge_bench.passthrough --server fastapi|aiohttp --port P --upstream URL ...``
listens on 127.0.0.1:P and forwards every ``POST /v1/chat/completions`` and
``/v1/completions`` body unchanged to the next upstream in turn (round robin over
``--upstream``), through one shared aiohttp client session (unbounded pool, keep-alive).
A JSON answer is read whole and returned with the upstream's status; an event stream is
relayed chunk by chunk as it arrives (``iter_any``), never decoded. ``GET /health`` is 200.

- ``fastapi``: a FastAPI app with one ``async def`` route under uvicorn (uvloop, httptools,
  no access log): the stack ridge's edge is written in.
- ``aiohttp``: an aiohttp.web app on uvloop (no access log).

Both run on uvloop, which sets TCP_NODELAY on every TCP connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from itertools import cycle

import aiohttp
import uvicorn
from aiohttp import web
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from ridge_bench.upstream import run_loop

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ridge_bench.passthrough",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("fastapi", "aiohttp"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", nargs="+", required=True, help="upstream base URLs")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        if args.server == "fastapi":
            serve_fastapi(args.port, args.upstream)
        else:
            run_loop(serve_aiohttp(args.port, args.upstream))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
