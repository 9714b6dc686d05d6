"""The load driver: a pure-Python aiohttp client, bounded in count and time.

:func:`drive` (throughput): ``concurrency`` workers share one ``aiohttp.ClientSession``
(:func:`load_session`, whose pool holds ``concurrency`` keep-alive connections); each worker
POSTs a small non-streaming chat completion, reads the whole answer, and starts the next,
until ``seconds`` have passed or ``max_requests`` were started. The caller runs a short
uncounted warm-up ``drive`` first on the same session. Every request is bounded by the
session's ``timeout_s``; a non-200 answer and every exception (timeout, reset, ...) count as
errors. Latency is measured per request (ms, successful requests only); requests/s =
successful requests / wall time of the run.

:func:`run_streams` (relay delay): ``count`` paced streams, one after another over one
keep-alive connection (or until ``seconds`` pass), after one uncounted warm-up stream. For
each: TTFT (ms from sending the request to the first content chunk), every chunk's delivery
delay (ms from the upstream's ``x_sent_ns`` stamp to its arrival here; both
``time.monotonic_ns``) and the gaps between consecutive chunks (ms; the upstream paces them
``interval`` apart).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

CHAT_BODY = json.dumps({
    "model": "bench-model", "max_tokens": 8,
    "messages": [{"role": "user", "content": "Say ok."}],
}).encode()
STREAM_BODY = json.dumps({
    "model": "bench-model", "max_tokens": 32, "stream": True,
    "messages": [{"role": "user", "content": "Count."}],
}).encode()
_HEADERS = {"content-type": "application/json"}


@dataclass
class LoadResult:
    """One throughput cell. ``latencies_ms`` of successful requests only."""

    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def merge(self, other: LoadResult) -> None:
        """Add another run of the same cell to this one."""
        self.ok += other.ok
        self.errors.update(other.errors)
        self.latencies_ms.extend(other.latencies_ms)
        self.wall_s += other.wall_s


@dataclass
class StreamResult:
    """One stream cell. Times in ms."""

    ttft_ms: list[float] = field(default_factory=list)
    delays_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    chunks: int = 0
    errors: Counter[str] = field(default_factory=Counter)


async def _one(session: aiohttp.ClientSession, url: str, result: LoadResult) -> None:
    started = time.perf_counter()
    try:
        async with session.post(url, data=CHAT_BODY, headers=_HEADERS) as resp:
            await resp.read()
            status = resp.status
    except Exception as exc:  # every failure is a counted error, by type
        result.errors[type(exc).__name__] += 1
        return
    if status != 200:
        result.errors[f"HTTP {status}"] += 1
        return
    result.ok += 1
    result.latencies_ms.append((time.perf_counter() - started) * 1000.0)


async def drive(session: aiohttp.ClientSession, url: str, concurrency: int,
                seconds: float, max_requests: int) -> LoadResult:
    """``concurrency`` closed-loop workers on ``url`` for ``seconds`` or ``max_requests``."""
    result = LoadResult()
    deadline = time.perf_counter() + seconds
    started = 0

    async def worker() -> None:
        nonlocal started
        while time.perf_counter() < deadline and started < max_requests:
            started += 1
            await _one(session, url, result)

    begin = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - begin
    return result


def load_session(concurrency: int, timeout_s: float) -> aiohttp.ClientSession:
    """A session with ``concurrency`` pooled connections; each request bounded by
    ``timeout_s``. Use it for a warm-up :func:`drive`, then the measured one."""
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    return aiohttp.ClientSession(connector=connector,
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))


async def _one_stream(session: aiohttp.ClientSession, url: str, result: StreamResult) -> None:
    sent = time.monotonic_ns()
    previous: int | None = None
    async with session.post(url, data=STREAM_BODY, headers=_HEADERS) as resp:
        if resp.status != 200:
            result.errors[f"HTTP {resp.status}"] += 1
            return
        async for line in resp.content:
            now = time.monotonic_ns()
            if not line.startswith(b"data: {"):
                continue
            stamp = json.loads(line[6:])["x_sent_ns"]
            if previous is None:
                result.ttft_ms.append((now - sent) / 1e6)
            else:
                result.gaps_ms.append((now - previous) / 1e6)
            result.delays_ms.append((now - stamp) / 1e6)
            result.chunks += 1
            previous = now


async def run_streams(url: str, count: int, seconds: float, timeout_s: float) -> StreamResult:
    """Per-chunk timing of ``count`` paced streams in a row, after one uncounted warm-up
    stream that opens the connections (see module doc)."""
    connector = aiohttp.TCPConnector(limit=1)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await _stream_series(session, url, 1, deadline)
        return await _stream_series(session, url, count, deadline)


async def _stream_series(session: aiohttp.ClientSession, url: str, count: int,
                         deadline: float) -> StreamResult:
    result = StreamResult()
    for _ in range(count):
        if time.perf_counter() >= deadline:
            break
        try:
            await _one_stream(session, url, result)
        except Exception as exc:  # counted, like every failure
            result.errors[type(exc).__name__] += 1
    return result
