"""The engine stand-in for the benchmarks: an OpenAI-style HTTP/1.1 server that costs next to
nothing per request, so the gateway in front of it is always the bottleneck.

``python -m ridge_bench.harness.upstream [--ports 0 0 ...] [--chunks 20]`` listens on 127.0.0.1
(one listener per ``--ports`` entry, 0 = a free port), prints ``READY <port> ...`` once all
listen, and runs on uvloop when installed. A raw ``asyncio.Protocol``, not a web framework: it
parses only the request line, the headers and Content-Length, keeps connections alive and
writes pre-built bytes.

Routes: ``POST /v1/chat/completions`` and ``/v1/completions`` (one fixed JSON completion; a
back-to-back stream for :data:`MODEL`; a paced stream for :data:`PACED_MODEL`, first chunk
after :data:`FIRST_CHUNK_S`, then one every :data:`INTER_CHUNK_S`, each chunk stamped with
``x_sent_ns``), ``GET /health``, ``/metrics`` and ``/v1/models``; anything else 404.
See docs/benchmarks/overhead.md#the-engine-stand-in.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import socket
import time
from collections.abc import Coroutine, Sequence
from typing import Any, cast

MODEL = "bench-model"
PACED_MODEL = "bench-model-paced"
FIRST_CHUNK_S = 0.020
INTER_CHUNK_S = 0.010
DEFAULT_CHUNKS = 20

_STREAM_MARKS = (b'"stream": true', b'"stream":true')
_PACED_MARK = b'"' + PACED_MODEL.encode() + b'"'


def _response(status: str, content_type: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


COMPLETION = json.dumps({
    "id": "cmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}, separators=(",", ":")).encode()

METRICS = b"".join(line + b"\n" for line in (
    b"vllm:num_requests_running 0", b"vllm:num_requests_waiting 0",
    b"vllm:kv_cache_usage_perc 0", b"vllm:prefix_cache_queries_total 0",
    b"vllm:prefix_cache_hits_total 0", b"vllm:prompt_tokens_total 0",
    b"vllm:generation_tokens_total 0",
    b'vllm:cache_config_info{block_size="16",num_gpu_blocks="4096"} 1',
))

MODELS = json.dumps({"object": "list", "data": [
    {"id": m, "object": "model", "owned_by": "bench"} for m in (MODEL, PACED_MODEL)]}).encode()

_OK_JSON = _response("200 OK", "application/json", COMPLETION)
_HEALTH = _response("200 OK", "text/plain", b"ok")
_METRICS = _response("200 OK", "text/plain; version=0.0.4", METRICS)
_MODELS = _response("200 OK", "application/json", MODELS)
_NOT_FOUND = _response("404 Not Found", "text/plain", b"not found")
_CHUNKED_REFUSED = _response("501 Not Implemented", "text/plain", b"chunked body")
_STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
_GET_ROUTES = {b"/health": _HEALTH, b"/metrics": _METRICS, b"/v1/models": _MODELS}
_POST_PATHS = (b"/v1/chat/completions", b"/v1/completions")


def _framed(data: bytes) -> bytes:
    """One chunk of HTTP/1.1 chunked transfer encoding."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def content_event(model: str, index: int, last: bool, sent_ns: int) -> bytes:
    """Content chunk ``index`` (1-based) as an SSE event, stamped with its send time [ns]."""
    finish = '"stop"' if last else "null"
    return (f'data: {{"id":"cmpl-bench","object":"chat.completion.chunk","created":0,'
            f'"model":"{model}","choices":[{{"index":0,"delta":{{"content":"t{index} "}},'
            f'"finish_reason":{finish}}}],"x_sent_ns":{sent_ns}}}\n\n').encode()


def usage_event(model: str, chunks: int) -> bytes:
    """The final usage chunk (no choices), as ``stream_options.include_usage`` asks."""
    return (f'data: {{"id":"cmpl-bench","object":"chat.completion.chunk","created":0,'
            f'"model":"{model}","choices":[],"usage":{{"prompt_tokens":5,'
            f'"completion_tokens":{chunks},"total_tokens":{chunks + 5}}}}}\n\n').encode()


DONE_EVENT = b"data: [DONE]\n\n"


class _Connection(asyncio.Protocol):
    """One client connection: parse requests as they complete, answer in order."""

    def __init__(self, chunks: int) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._timer is None:
            self._serve_buffered()

    def _serve_buffered(self) -> None:
        while self._transport is not None and self._timer is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buf[:end]).lower()
            length = _content_length(head)
            if len(self._buf) < end + 4 + length:
                return
            body = bytes(self._buf[end + 4:end + 4 + length])
            del self._buf[:end + 4 + length]
            self._close_after = b"\r\nconnection: close" in head
            self._answer(head, body)

    def _answer(self, head: bytes, body: bytes) -> None:
        assert self._transport is not None
        method, _, rest = head.partition(b" ")
        path = rest.partition(b" ")[0].partition(b"?")[0]
        if b"\r\ntransfer-encoding: chunked" in head:
            self._close_after = True
            self._finish(_CHUNKED_REFUSED)
        elif method == b"post" and path in _POST_PATHS:
            self._generate(body)
        else:
            self._finish(_GET_ROUTES.get(path, _NOT_FOUND) if method == b"get" else _NOT_FOUND)

    def _generate(self, body: bytes) -> None:
        if not any(mark in body for mark in _STREAM_MARKS):
            self._finish(_OK_JSON)
        elif _PACED_MARK in body:
            self._start_paced()
        else:
            events = [content_event(MODEL, k, k == self._chunks, time.monotonic_ns())
                      for k in range(1, self._chunks + 1)]
            events += [usage_event(MODEL, self._chunks), DONE_EVENT]
            self._finish(_STREAM_HEAD + b"".join(map(_framed, events)) + b"0\r\n\r\n")

    def _start_paced(self) -> None:
        assert self._transport is not None
        self._transport.write(_STREAM_HEAD)
        loop = asyncio.get_running_loop()
        start = loop.time() + FIRST_CHUNK_S
        self._timer = loop.call_at(start, self._paced_chunk, loop, start, 1)

    def _paced_chunk(self, loop: asyncio.AbstractEventLoop, start: float, k: int) -> None:
        if self._transport is None:
            return
        last = k == self._chunks
        data = _framed(content_event(PACED_MODEL, k, last, time.monotonic_ns()))
        if not last:
            self._transport.write(data)
            deadline = start + k * INTER_CHUNK_S
            self._timer = loop.call_at(deadline, self._paced_chunk, loop, start, k + 1)
            return
        self._timer = None
        tail = _framed(usage_event(PACED_MODEL, self._chunks)) + _framed(DONE_EVENT)
        self._finish(data + tail + b"0\r\n\r\n")
        self._serve_buffered()

    def _finish(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)
        if self._close_after:
            self._transport.close()
            self._transport = None


def _content_length(head: bytes) -> int:
    """Content-Length from a lower-cased header block; 0 when absent or malformed."""
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    start = at + len(b"\r\ncontent-length:")
    stop = head.find(b"\r\n", start)
    value = head[start:] if stop < 0 else head[start:stop]
    try:
        return max(0, int(value.strip()))
    except ValueError:
        return 0


def listen(port: int) -> socket.socket:
    """A listening 127.0.0.1 socket (``port`` 0: a free one) with TCP_NODELAY."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    sock.setblocking(False)
    return sock


async def start_servers(ports: Sequence[int], chunks: int) -> list[asyncio.Server]:
    """One listening server per port (0: a free one) on the running loop."""
    loop = asyncio.get_running_loop()
    return [await loop.create_server(lambda: _Connection(chunks), sock=listen(p))
            for p in ports]


async def serve(ports: Sequence[int], chunks: int) -> None:
    """Serve on every port until cancelled; prints ``READY <port> ...`` once listening."""
    servers = await start_servers(ports, chunks)
    bound = [s.sockets[0].getsockname()[1] for s in servers]
    print("READY " + " ".join(str(p) for p in bound), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for server in servers:
            server.close()


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine on uvloop when installed, else on asyncio's own loop."""
    if importlib.util.find_spec("uvloop") is None:
        asyncio.run(main)
        return
    import uvloop

    uvloop.run(main)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ridge_bench.harness.upstream",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--ports", type=int, nargs="+", default=[0],
                        help="ports to listen on, 0 = a free one (default: one free port)")
    parser.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS,
                        help=f"content chunks per stream (default {DEFAULT_CHUNKS})")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(serve(args.ports, args.chunks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
