"""The streaming client of the overhead benchmark: closed-loop SSE streams in pure Python
(aiohttp on this process's loop), for what wrk cannot see inside a stream.

:func:`run_streams`: ``concurrency`` workers share one session (a pool of ``concurrency``
keep-alive connections); each POSTs the stream body, reads the whole stream line by line and
starts the next, until ``seconds`` have passed (streams in flight then finish and count). Per
stream it records, with ``time.monotonic_ns`` (one clock with the engine stand-in's
``x_sent_ns`` stamps):

- TTFT [ms]: request sent → first content chunk (a ``data:`` line with a ``"delta"``) read;
- every content chunk's delivery delay [ms]: its ``x_sent_ns`` stamp → read here;
- events: every ``data:`` line (content chunks, the usage chunk, ``[DONE]``).

A stream counts as an error (by cause) unless it answers 200, carries exactly ``expect``
content chunks, a usage chunk and ``[DONE]``; every exception counts too (each stream bounded
by ``timeout_s``). Its TTFT and delays are kept only when it succeeds.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

_HEADERS = {"content-type": "application/json"}
_STAMP = b'"x_sent_ns":'


@dataclass
class StreamResult:
    """One stream window. Times in ms."""

    ttft_ms: list[float] = field(default_factory=list)
    delays_ms: list[float] = field(default_factory=list)
    streams: int = 0
    events: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


@dataclass
class _Stream:
    ttft_ms: float | None = None
    delays_ms: list[float] = field(default_factory=list)
    content: int = 0
    events: int = 0
    usage: bool = False
    done: bool = False


def _stamp(line: bytes) -> int | None:
    at = line.find(_STAMP)
    if at < 0:
        return None
    start = at + len(_STAMP)
    end = start
    while end < len(line) and line[end:end + 1].isdigit():
        end += 1
    return int(line[start:end]) if end > start else None


def _read_line(stream: _Stream, line: bytes, sent_ns: int, now_ns: int) -> None:
    if not line.startswith(b"data: "):
        return
    stream.events += 1
    if line.startswith(b"data: [DONE]"):
        stream.done = True
    elif b'"delta"' in line:
        stream.content += 1
        if stream.ttft_ms is None:
            stream.ttft_ms = (now_ns - sent_ns) / 1e6
        stamp = _stamp(line)
        if stamp is not None:
            stream.delays_ms.append((now_ns - stamp) / 1e6)
    elif b'"usage"' in line:
        stream.usage = True


async def one_stream(session: aiohttp.ClientSession, url: str, body: bytes) -> _Stream | str:
    """One stream read to its end: its figures, or the cause of its failure."""
    sent = time.monotonic_ns()
    stream = _Stream()
    async with session.post(url, data=body, headers=_HEADERS) as resp:
        if resp.status != 200:
            await resp.read()
            return f"HTTP {resp.status}"
        async for line in resp.content:
            _read_line(stream, line, sent, time.monotonic_ns())
    return stream


def _verdict(stream: _Stream, expect: int) -> str | None:
    if stream.content != expect:
        return f"{stream.content} of {expect} chunks"
    if not stream.usage or not stream.done:
        return "no usage chunk" if not stream.usage else "no [DONE]"
    return None


def _record(result: StreamResult, outcome: _Stream | str, expect: int) -> None:
    if isinstance(outcome, str):
        result.errors[outcome] += 1
        return
    result.events += outcome.events
    problem = _verdict(outcome, expect)
    if problem is not None:
        result.errors[problem] += 1
        return
    result.streams += 1
    assert outcome.ttft_ms is not None
    result.ttft_ms.append(outcome.ttft_ms)
    result.delays_ms.extend(outcome.delays_ms)


async def run_streams(url: str, body: bytes, expect: int, concurrency: int, seconds: float,
                      timeout_s: float = 30.0) -> StreamResult:
    """``concurrency`` closed-loop stream workers on ``url`` for ``seconds`` (module doc)."""
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    result = StreamResult()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                try:
                    outcome = await one_stream(session, url, body)
                except Exception as exc:  # every failure is a counted error, by type
                    outcome = type(exc).__name__
                _record(result, outcome, expect)

        begin = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.monotonic() - begin
    return result
