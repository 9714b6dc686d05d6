"""A minimal, fast fake engine for the benchmarks (never for tests of behaviour).

``python -m bench.upstream [--port 0] [--chunks 20] [--interval-ms 20]`` serves on 127.0.0.1
and prints ``READY <port>`` on stdout once it listens. It runs on uvloop when installed.

- ``POST /v1/chat/completions`` and ``/v1/completions`` with ``"stream": false`` (or absent):
  one fixed small JSON completion, at once.
- the same with ``"stream": true``: a paced SSE stream of ``chunks`` content chunks, chunk k
  (k = 1..chunks) sent ``k * interval_ms`` milliseconds after the response headers, then
  ``data: [DONE]``. Each chunk carries ``x_sent_ns``, the sender's ``time.monotonic_ns()``
  when it was written (CLOCK_MONOTONIC is one clock for every process of the machine), so a
  client can measure every chunk's delivery delay exactly.
- ``GET /health`` (200) and ``GET /metrics`` (a two-line vLLM page), for ridge's poller.

Pacing is against absolute deadlines (start + k * interval), so a late chunk does not delay
the ones after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import socket
import time
from collections.abc import Sequence

from aiohttp import web

MODEL = "bench-model"

_COMPLETION = json.dumps({
    "id": "cmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}).encode()

_METRICS = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"


def chunk_event(index: int, sent_ns: int) -> bytes:
    """One OpenAI chat-completion chunk as an SSE event, stamped with its send time (ns)."""
    chunk = {
        "id": "cmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": f"t{index} "}, "finish_reason": None}],
        "x_index": index, "x_sent_ns": sent_ns,
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def make_app(chunks: int, interval_s: float) -> web.Application:
    """The fake engine's routes; ``interval_s`` is the stream pacing in seconds."""

    async def generate(request: web.Request) -> web.StreamResponse:
        payload = json.loads(await request.read())
        if not payload.get("stream"):
            return web.Response(body=_COMPLETION, content_type="application/json")
        return await _paced_stream(request, chunks, interval_s)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=_METRICS, content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


async def _paced_stream(
    request: web.Request, chunks: int, interval_s: float
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream",
                                       "cache-control": "no-cache"})
    await resp.prepare(request)  # a StreamResponse sends its headers at once
    loop = asyncio.get_running_loop()
    start = loop.time()
    for k in range(1, chunks + 1):
        await asyncio.sleep(max(0.0, start + k * interval_s - loop.time()))
        await resp.write(chunk_event(k, time.monotonic_ns()))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def serve(port: int, chunks: int, interval_s: float) -> None:
    """Serve until cancelled; prints ``READY <port>`` once listening."""
    runner = web.AppRunner(make_app(chunks, interval_s), access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    await web.SockSite(runner, sock).start()
    print(f"READY {sock.getsockname()[1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _run(port: int, chunks: int, interval_s: float) -> None:
    if importlib.util.find_spec("uvloop") is None:
        asyncio.run(serve(port, chunks, interval_s))
        return
    import uvloop

    uvloop.run(serve(port, chunks, interval_s))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=20, help="content chunks per stream")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="stream pacing (ms)")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        _run(args.port, args.chunks, args.interval_ms / 1000.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
