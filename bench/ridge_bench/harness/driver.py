"""The load driver: replays a workload against an OpenAI-compatible URL, open loop, bounded.

:func:`run_workload` sends each arrival of the schedule at its time as a streamed chat
completion in its own task (the client never queues), the turn taken from
:class:`ridge_bench.harness.turns.Dispatcher`; it stops sending at the first of the request
bound, the duration bound, the schedule's end or ``stop``, waits up to ``drain_s`` for the
requests in flight and cancels the rest (counted ``unfinished``).

Each request (:func:`request_body`) sets ``include_usage``, ``ignore_eos`` and a ``seed`` fixed
by (conversation, turn), so every router serves the same tokens and the same next prompts. Times
are the client's monotonic clock (:mod:`ridge_bench.harness.goodput`); the route headers name
the pool and replica. The driver also tracks f over the prompts sent
(:class:`ridge_bench.harness.prefix.PrefixTracker`) and its own CPU time.
See docs/benchmarks/router.md#the-load-driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ridge_bench.harness.goodput import RequestResult
from ridge_bench.harness.prefix import PrefixTracker
from ridge_bench.harness.progress import Counts, Progress
from ridge_bench.harness.route import HEADER, Route, parse_route
from ridge_bench.harness.turns import Dispatcher, Pending
from ridge_bench.harness.workloads import Arrival, Workload

CHAT_PATH = "/v1/chat/completions"
ENDPOINT_HEADER = "x-ridge-endpoint"
"""ridge's response header naming the replica a request went to, within its pool."""


@dataclass(frozen=True)
class Destination:
    """Where to send: the gateway's base URL and the model name."""

    base_url: str
    model: str
    ignore_eos: bool = True
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Bounds:
    """At most ``requests`` requests, sent within ``duration_s``; then ``drain_s`` to finish."""

    requests: int
    duration_s: float
    drain_s: float


@dataclass
class RunData:
    """What one run produced. Times in seconds; ``window_s`` is the arrival window
    (:mod:`ridge_bench.harness.goodput`), ``wall_s`` from the start until the drain ended."""

    results: list[RequestResult] = field(default_factory=list)
    window_s: float = 0.0
    wall_s: float = 0.0
    interrupted: bool = False
    sent_prefix: PrefixTracker = field(default_factory=PrefixTracker)
    client_cpu_s: float = 0.0


def request_body(target: Destination, pending: Pending) -> dict[str, Any]:
    """The JSON body of one turn (module doc)."""
    key = pending.session.conversation.key
    body: dict[str, Any] = {
        "model": target.model,
        "messages": pending.messages,
        "max_tokens": pending.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "seed": zlib.crc32(f"{key}:{pending.turn}".encode()),
    }
    if target.ignore_eos:
        body["ignore_eos"] = True
    return body


@dataclass
class StreamReader:
    """Folds a chat-completion SSE stream: content, first-content time, usage, errors."""

    clock: Callable[[], float]
    route: Route = field(default_factory=Route)
    first_content_at: float | None = None
    parts: list[str] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    error: str | None = None

    def feed(self, line: bytes) -> None:
        """One line of the stream."""
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            self.error = "bad event"
            return
        self._event(event if isinstance(event, dict) else {})

    def _event(self, event: dict[str, Any]) -> None:
        if "error" in event:
            err = event["error"]
            self.error = f"stream error {err.get('code') if isinstance(err, dict) else err}"
            return
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        for choice in event.get("choices") or ():
            text = (choice.get("delta") or {}).get("content")
            if text:
                if self.first_content_at is None:
                    self.first_content_at = self.clock()
                self.parts.append(text)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _usage_int(usage: Mapping[str, Any], *path: str) -> int | None:
    value: Any = usage
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int) else None


async def send_one(session: aiohttp.ClientSession, target: Destination, pending: Pending,
                   arrival: Arrival, start: float, reader: StreamReader
                   ) -> tuple[RequestResult, str | None]:
    """Send one turn and read its stream into ``reader``; the result and the reply (None when
    it failed). If cancelled, ``reader`` keeps what had arrived (the route, ...)."""
    clock = reader.clock
    sent = clock()
    common: dict[str, Any] = {"kind": pending.kind, "step": arrival.step, "sent_s": sent - start,
                              "key": f"{pending.session.conversation.key}:{pending.turn}"}
    try:
        async with session.post(target.base_url + CHAT_PATH, json=request_body(target, pending),
                                headers=dict(target.headers)) as resp:
            reader.route = parse_route(resp.headers.get(HEADER))
            common["endpoint"] = resp.headers.get(ENDPOINT_HEADER)
            if resp.status != 200:
                await resp.read()
                return RequestResult(error=f"HTTP {resp.status}", route=reader.route,
                                     e2e_s=clock() - sent, **common), None
            async for line in resp.content:
                reader.feed(line)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # every failure is a counted error, by type
        return RequestResult(error=type(exc).__name__, route=reader.route, **common), None
    return _finished(reader, sent, clock(), common)


def _finished(reader: StreamReader, sent: float, ended: float,
              common: dict[str, Any]) -> tuple[RequestResult, str | None]:
    error = reader.error or (None if reader.done else "stream cut")
    tokens = _usage_int(reader.usage, "completion_tokens")
    result = RequestResult(
        error=error, route=reader.route,
        ttft_s=None if reader.first_content_at is None else reader.first_content_at - sent,
        e2e_s=ended - sent,
        output_tokens=tokens if tokens is not None else len(reader.parts),
        prompt_tokens=_usage_int(reader.usage, "prompt_tokens"),
        cached_tokens=_usage_int(reader.usage, "prompt_tokens_details", "cached_tokens"),
        **common,
    )
    return result, (reader.text if error is None else None)


class _Run:
    """One run's moving parts: the dispatcher, the tasks in flight, the counts."""

    def __init__(self, workload: Workload, target: Destination, session: aiohttp.ClientSession,
                 clock: Callable[[], float]) -> None:
        self.workload, self.target, self.session, self.clock = workload, target, session, clock
        self.dispatcher = Dispatcher(workload.sources)
        self.data = RunData()
        self.tasks: set[asyncio.Task[None]] = set()
        self.start = clock()
        self.sent = 0
        self.draining = False

    def counts(self) -> Counts:
        done = len(self.data.results)
        errors = sum(1 for r in self.data.results if not r.ok)
        return Counts(self.sent, done, done - errors, errors, self.clock() - self.start,
                      self.draining)

    def launch(self, arrival: Arrival) -> None:
        pending = self.dispatcher.take(arrival.kind)
        self.data.sent_prefix.observe(pending.messages)
        self.sent += 1
        task = asyncio.create_task(self._request(pending, arrival))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _request(self, pending: Pending, arrival: Arrival) -> None:
        reader = StreamReader(self.clock)
        try:
            result, reply = await send_one(self.session, self.target, pending, arrival,
                                           self.start, reader)
        except asyncio.CancelledError:
            self.data.results.append(RequestResult(
                pending.kind, arrival.step, arrival.at_s, "unfinished", route=reader.route))
            raise
        self.data.results.append(result)
        self.dispatcher.done(pending, reply)


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``event`` is set first; True if it was."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


async def _send_all(run: _Run, bounds: Bounds, stop: asyncio.Event) -> float:
    """Send the schedule's arrivals; returns the arrival window: until the stop, or the last
    request when the request bound ends it, else the whole duration (the schedule ran on with
    no arrival left in it)."""
    schedule_s = sum(step.duration_s for step in run.workload.steps)
    for arrival in run.workload.arrivals(bounds.requests):
        if arrival.at_s >= bounds.duration_s:
            break
        if await _wait(stop, run.start + arrival.at_s - run.clock()):
            return run.clock() - run.start
        run.launch(arrival)
    if run.sent >= bounds.requests:
        return run.clock() - run.start
    return min(bounds.duration_s, schedule_s)


async def _drain(run: _Run, drain_s: float, stop: asyncio.Event) -> None:
    """Wait up to ``drain_s`` for the requests in flight (less if ``stop`` is set), then
    cancel the rest."""
    run.draining = True
    waiter = asyncio.ensure_future(stop.wait())
    deadline = run.clock() + drain_s
    while run.tasks and not stop.is_set() and run.clock() < deadline:
        await asyncio.wait({*run.tasks, waiter}, timeout=deadline - run.clock(),
                           return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    for task in list(run.tasks):
        task.cancel()
    await asyncio.gather(*run.tasks, return_exceptions=True)


async def _tick(run: _Run, progress: Progress) -> None:
    while True:
        progress.show(run.counts())
        await asyncio.sleep(0.25)


async def run_workload(workload: Workload, target: Destination, bounds: Bounds,
                       stop: asyncio.Event | None = None, progress: Progress | None = None,
                       clock: Callable[[], float] = time.perf_counter) -> RunData:
    """Run ``workload`` against ``target`` within ``bounds`` (module doc)."""
    stop = stop if stop is not None else asyncio.Event()
    cpu0 = time.process_time()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, connect=10.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        run = _Run(workload, target, session, clock)
        ticker = asyncio.create_task(_tick(run, progress)) if progress else None
        try:
            run.data.window_s = await _send_all(run, bounds, stop)
            stopped_early = stop.is_set()
            await _drain(run, bounds.drain_s, stop)
            run.data.interrupted = stopped_early or stop.is_set()
        finally:
            if ticker is not None:
                ticker.cancel()
            run.data.wall_s = run.clock() - run.start
            run.data.client_cpu_s = time.process_time() - cpu0
            if progress is not None:
                progress.close(run.counts())
    return run.data
