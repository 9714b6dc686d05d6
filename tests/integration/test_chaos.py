"""Chaos run: engines killed and restarted at seeded-random moments under load, through a real
``ridge serve``.

Three fake engines form one pool; ridge runs as its own process with two retries, so a request
refused by two dead endpoints still reaches the third. Eight clients send a fixed, seeded plan
of 240 requests — chat and completions, streamed (with or without usage) and not, 2 to 10
tokens at 20 ms a token. Meanwhile a chaos task kills engines and starts them again on the same
port: a kill closes the listener and aborts every open connection at once, as a crashed process
would (a seeded half of the kills with ``SO_LINGER`` 0, a TCP reset; the others a bare close),
so a stream being generated there is cut mid-way and a request waiting for its answer there is
refused before its first byte. Kills come at seeded points of the load's progress; each takes
one endpoint (preferably one with a stream under way) or two, and always leaves at least one
endpoint that ridge routes to (its ``ridge_endpoint_up`` gauge reads 1) alive, so at every
moment some endpoint can take a retried request. Killed engines stay down for a seeded
0.05–0.6 s.

Asserted, for every request:

- it ends (a 60 s client timeout is the hang detector only) with a status of 200: an endpoint
  was always up, so no request may be lost before its first byte — not a non-streamed one, not
  a stream whose engine died before its response head;
- a whole answer is the engine's text, untouched; a stream either ends whole (every token, the
  usage chunk only when asked for, ``[DONE]``) or, cut by a kill, ends with an OpenAI-shaped
  error event and no ``[DONE]``, after a prefix of the text;
- no body carries an engine address or a library's exception text.

After the load: at least ``MIN_KILLS`` kills happened and at least one stream was cut; ridge's
in-flight gauges (``ridge_requests_in_flight``, ``ridge_endpoint_requests_in_flight``,
``ridge_pool_concurrency``, ``ridge_tokens_in_flight``) are back to 0, every endpoint is up
again, and ``ridge_requests_total`` counts what the clients saw (a cut stream as a 502, every
other request as a 200); ridge serves a normal request, streamed and not; its log holds no
traceback. A failure message carries the run's timeline: kills, restarts, ridge's view of the
endpoints, and every request that went wrong, with times; and for a request lost at the client
and for one slower than ``SLOW_S``, which engines received it and ridge's log lines about it
(every request carries its own ``x-request-id``), with ridge's request counts and in-flight
gauges at that moment.

Run with every upstream transport. Nothing depends on timing: the plan and the chaos draw from
seeded generators, counts are bounded, waits are bounded generously and serve as hang
detectors. ridge's health checks run at a test's pace: polls every 0.2 s, circuit breakers
open for 0.5–2 s.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import struct
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.engine import WORDS, FakeEngine
from tests.real_engine.servers import Server, start_ridge, stop_all, write_fleet

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a subprocess gateway")

SEED = 20_240_917
ENGINES, CLIENTS, REQUESTS = 3, 8, 240
TOKEN_INTERVAL_S = 0.02  # the engines' time per token [s]
KILLS, MIN_KILLS = 12, 4  # kill events planned; fewest endpoint kills that must have happened
DOWN_S = (0.05, 0.6)  # how long killed engines stay down [s], drawn uniformly
HANG_S = 60.0  # one request's hang detector [s]
WAIT_S = 60.0  # how long a check waits for what takes ~a poll interval (or a breaker) [s]
SLOW_S = 3.0  # a request this slow is reported with a failure's evidence [s]
RIDGE_ENV = {
    "RIDGE_UPSTREAM__RETRIES": "2",
    "RIDGE_REGISTRY__POLL_INTERVAL_S": "0.2",
    "RIDGE_REGISTRY__BREAKER_OPEN_S": "0.5",
    "RIDGE_REGISTRY__BREAKER_MAX_OPEN_S": "2",
}
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 16384}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
IN_FLIGHT_GAUGES = ("ridge_requests_in_flight", "ridge_endpoint_requests_in_flight",
                    "ridge_pool_concurrency", "ridge_tokens_in_flight")
# what only ridge's log may say: an address, a library's or the kernel's words for a failure
LEAKS = ("127.0.0.1", "localhost", "Traceback", "Errno", "aiohttp", "httpx", "httpcore",
         "httptools", "ClientConnect", "ServerDisconnected", "ReadError", "ConnectError",
         "ConnectionReset", "ConnectionRefused", "reset by peer", "refused",
         "connection closed", "cannot connect", "Exception")
TOPICS = ("the tides", "a sourdough starter", "binary search", "the roofline model",
          "compound interest", "photosynthesis")


# -- the engines -----------------------------------------------------------------------------


@dataclass
class KillableEngine(FakeEngine):
    """A :class:`FakeEngine` that can be killed as a crash would, and started again on its port.

    ``streaming`` counts the streams whose response head is out and whose end is not: a kill
    then cuts them mid-way."""

    port: int = 0
    streaming: int = 0
    down: bool = False

    async def start(self, port: int = 0) -> str:
        url = await super().start(port or self.port)
        self.port, self.down = int(url.rsplit(":", 1)[1]), False
        return url

    async def kill(self, reset: bool) -> None:
        """Close the listener and abort every connection, in one step of the event loop (no
        request slips in between); ``reset``: with a TCP reset (``SO_LINGER`` 0)."""
        runner, self._runner = self._runner, None
        assert runner is not None and runner.server is not None
        self.down = True
        for site in list(runner.sites):
            await site.stop()  # closes the listening socket; it does not suspend
        for handler in runner.server.connections:
            transport = handler.transport
            if transport is None:
                continue
            sock = transport.get_extra_info("socket")
            if reset and sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        await asyncio.wait_for(runner.cleanup(), WAIT_S)  # handlers cancelled: quick

    async def _stream(self, request: web.Request, payload: dict[str, Any],
                      chat: bool) -> web.StreamResponse:
        self.streaming += 1
        try:
            return await super()._stream(request, payload, chat)
        finally:
            self.streaming -= 1


@pytest.fixture
async def engines() -> AsyncIterator[list[KillableEngine]]:
    fakes = [KillableEngine(model="m", token_interval_s=TOKEN_INTERVAL_S) for _ in range(ENGINES)]
    for fake in fakes:
        await fake.start()
    yield fakes
    for fake in fakes:
        await fake.stop()


@pytest.fixture
async def ridge(engines: list[KillableEngine], tmp_path: Path,
                transport: str) -> AsyncIterator[Server]:
    fleet = write_fleet({"pools": [{"name": "main", "engine": "vllm", "models": ["m"],
                                    "model": FACTS, "hardware": L4,
                                    "endpoints": [e.url for e in engines]}]},
                        tmp_path / "fleet.yaml")
    env = {**RIDGE_ENV, "RIDGE_UPSTREAM__TRANSPORT": transport}
    server = await asyncio.to_thread(start_ridge, fleet, tmp_path, "ridge", env)
    try:
        yield server
    finally:
        await asyncio.to_thread(stop_all, [server])


# -- the timeline (for failure messages) -----------------------------------------------------


@dataclass
class Timeline:
    t0: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, what: str, at: float | None = None) -> None:
        self.events.append((self.now() if at is None else at, what))

    def text(self, lines: int = 200) -> str:
        return "\n".join(f"{t:8.3f} s  {what}" for t, what in sorted(self.events)[:lines])


# -- the load --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One planned request."""

    index: int
    chat: bool
    stream: bool
    usage: bool  # a stream asking for its usage chunk
    tokens: int
    topic: str

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"

    def body(self) -> dict[str, Any]:
        ask = f"Tell me about {self.topic} (question {self.index})."
        body: dict[str, Any] = {"model": "m", "max_tokens": self.tokens}
        if self.chat:
            body["messages"] = [{"role": "system", "content": "You explain things briefly."},
                                {"role": "user", "content": ask}]
        else:
            body["prompt"] = ask
        if self.stream:
            body["stream"] = True
            if self.usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def text(self) -> str:
        """What the fake engine generates for it."""
        return " ".join(WORDS[i % len(WORDS)] for i in range(self.tokens))

    @property
    def request_id(self) -> str:
        """The ``x-request-id`` the client sends: ridge's log lines about it carry it."""
        return f"chaos-{self.index}"

    def __str__(self) -> str:
        kind = "stream" if self.stream else "whole"
        return f"request {self.index} ({kind}, {self.path}, {self.tokens} tokens)"


def plan(rng: random.Random) -> list[Spec]:
    return [Spec(i, chat=rng.random() < 0.7, stream=rng.random() < 0.5,
                 usage=rng.random() < 0.5, tokens=rng.randint(2, 10), topic=rng.choice(TOPICS))
            for i in range(REQUESTS)]


@dataclass
class Outcome:
    spec: Spec
    status: int = 0
    body: bytes = b""
    error: str | None = None  # the client's: a hang, a connection ridge dropped
    request_id: str = ""
    started: float = 0.0
    ended: float = 0.0


@dataclass
class Progress:
    done: int = 0
    finished: asyncio.Event = field(default_factory=asyncio.Event)


async def send(session: aiohttp.ClientSession, url: str, spec: Spec,
               timeline: Timeline | None = None) -> Outcome:
    outcome = Outcome(spec, started=timeline.now() if timeline else 0.0)
    try:
        async with asyncio.timeout(HANG_S), session.post(
                url + spec.path, json=spec.body(), headers={"x-request-id": spec.request_id}) as r:
            outcome.status, outcome.request_id = r.status, r.headers.get("x-request-id", "")
            async for chunk in r.content.iter_any():
                outcome.body += chunk
    except TimeoutError:
        outcome.error = f"hang: no end within {HANG_S:g} s"
    except aiohttp.ClientError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.ended = timeline.now() if timeline else 0.0
    return outcome


async def run_load(url: str, specs: list[Spec], progress: Progress,
                   timeline: Timeline) -> list[Outcome]:
    """``CLIENTS`` clients, each sending its share of the plan one request after another."""
    outcomes: list[Outcome] = []

    async def client(mine: list[Spec], session: aiohttp.ClientSession) -> None:
        for spec in mine:
            outcomes.append(await send(session, url, spec, timeline))
            progress.done += 1

    connector = aiohttp.TCPConnector(limit=CLIENTS)
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(client(specs[i::CLIENTS], session) for i in range(CLIENTS)))
    finally:
        progress.finished.set()
    return sorted(outcomes, key=lambda o: o.spec.index)


# -- ridge's gauges --------------------------------------------------------------------------


Samples = dict[str, list[tuple[dict[str, str], float]]]


async def gauges(http: aiohttp.ClientSession, ridge_url: str) -> Samples:
    async with http.get(ridge_url + "/metrics", timeout=aiohttp.ClientTimeout(total=WAIT_S)) as r:
        assert r.status == 200, await r.text()
        text = await r.text()
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def routable(samples: Samples, engines: list[KillableEngine]) -> set[int]:
    """The engines ridge routes to now (``ridge_endpoint_up`` 1), by index."""
    up = {labels["endpoint"] for labels, value in samples.get("ridge_endpoint_up", [])
          if value == 1.0}
    return {i for i, engine in enumerate(engines) if engine.url in up}


def nothing_in_flight(samples: Samples) -> bool:
    return all(value == 0.0 for name in IN_FLIGHT_GAUGES for _, value in samples.get(name, []))


def by_status(samples: Samples) -> dict[str, int]:
    """``ridge_requests_total`` summed by status."""
    counts: Counter[str] = Counter()
    for labels, value in samples.get("ridge_requests_total", []):
        counts[labels["status"]] += int(value)
    return dict(counts)


async def wait_for_gauges(http: aiohttp.ClientSession, ridge_url: str,
                          ready: Callable[[Samples], bool], what: str) -> Samples:
    """Poll ridge's /metrics until ``ready``; fail with the last figures after ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while not ready(samples := await gauges(http, ridge_url)):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    else:
        return samples
    shown: dict[str, Any] = {n: samples.get(n) for n in ("ridge_endpoint_up", *IN_FLIGHT_GAUGES)}
    shown["requests by status"] = by_status(samples)
    raise AssertionError(f"ridge's gauges never showed {what} in {WAIT_S:g} s: {shown}")


async def watch(ridge_url: str, engines: list[KillableEngine], timeline: Timeline,
                progress: Progress) -> None:
    """Note every change of ridge's view of the endpoints while the load runs."""
    seen: set[int] | None = None
    async with aiohttp.ClientSession() as http:
        while not progress.finished.is_set():
            view = routable(await gauges(http, ridge_url), engines)
            if view != seen:
                timeline.add(f"ridge routes to {sorted(view)}")
                seen = view
            await asyncio.sleep(0.05)


# -- the chaos -------------------------------------------------------------------------------


@dataclass
class ChaosLog:
    events: int = 0
    kills: int = 0  # endpoint kills (a double kill counts two)
    resets: int = 0
    doubles: int = 0
    with_streams: int = 0  # kill events that found a stream under way on a victim


async def chaos(engines: list[KillableEngine], ridge_url: str, rng: random.Random,
                progress: Progress, timeline: Timeline) -> ChaosLog:
    """``KILLS`` kill events at seeded points of the load's progress, while it runs; every
    killed engine is started again before this returns."""
    log = ChaosLog()
    points = sorted(rng.sample(range(REQUESTS // 20, REQUESTS * 4 // 5), KILLS))
    try:
        async with aiohttp.ClientSession() as http:
            for point in points:
                if not await _reached(point, progress):
                    break
                await _kill_event(http, ridge_url, engines, rng, log, progress, timeline)
    finally:
        for engine in engines:
            if engine.down:
                await engine.start()
    return log


async def _reached(point: int, progress: Progress) -> bool:
    """Wait until ``point`` requests are done; False if the load finished first."""
    while progress.done < point:
        if progress.finished.is_set():
            return False
        await asyncio.sleep(0.01)
    return True


async def _kill_event(http: aiohttp.ClientSession, ridge_url: str,
                      engines: list[KillableEngine], rng: random.Random, log: ChaosLog,
                      progress: Progress, timeline: Timeline) -> None:
    """Kill one engine, or two, leaving alive one that ridge routes to; wait a seeded while;
    start them again. Waits first for a stream to be under way (up to ~1 s) and for ridge
    to route to two endpoints at least."""
    for _ in range(100):
        if any(e.streaming for e in engines) or progress.finished.is_set():
            break
        await asyncio.sleep(0.01)
    view: set[int] = set()
    while len(view) < 2:
        if progress.finished.is_set():
            return
        view = routable(await gauges(http, ridge_url), engines)
        if len(view) < 2:
            await asyncio.sleep(0.05)
    streaming = sorted(i for i in view if engines[i].streaming)
    first = rng.choice(streaming or sorted(view))
    victims = [first]
    if rng.random() < 0.3:  # a double kill, still leaving one routed-to endpoint alive
        victims.append(rng.choice([i for i in range(ENGINES) if i != first
                                   and view - {first, i}]))
        log.doubles += 1
    reset, down_s = rng.random() < 0.5, rng.uniform(*DOWN_S)
    log.with_streams += any(engines[i].streaming for i in victims)
    timeline.add(f"KILL {victims} ({'reset' if reset else 'close'}, streams under way "
                 f"{[engines[i].streaming for i in victims]}) for {down_s:.2f} s; ridge routed "
                 f"to {sorted(view)}; {progress.done} requests done")
    for i in victims:
        await engines[i].kill(reset)
    log.events += 1
    log.kills += len(victims)
    log.resets += len(victims) if reset else 0
    await asyncio.sleep(down_s)
    for i in victims:
        await engines[i].start()
    timeline.add(f"START {victims}")


# -- checking what clients got ---------------------------------------------------------------


@dataclass
class Tally:
    problems: list[str] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)


def check(outcome: Outcome, tally: Tally, timeline: Timeline) -> None:
    """Every rule of the module docstring, for one request; a broken rule is a problem (and
    goes on the timeline)."""
    spec, body = outcome.spec, outcome.body
    kind = _kind(outcome)
    tally.kinds[kind] += 1
    leaked = [word for word in LEAKS if word.encode().lower() in body.lower()]
    problem = None
    if kind.startswith(("LOST", "NOT RETRIED", "bad")):
        problem = f"{kind}: status {outcome.status}, body {body[-300:]!r}"
    if leaked:
        problem = f"{problem or kind}; the body carries {leaked}: {body[-300:]!r}"
    if problem is not None:
        what = f"{spec} [{outcome.request_id}] {outcome.started:.3f}-{outcome.ended:.3f} s"
        tally.problems.append(f"{what}: {problem}")
        timeline.add(f"{spec} ended: {problem[:160]}", outcome.ended)


def _kind(outcome: Outcome) -> str:
    if outcome.error is not None:
        return f"LOST at the client ({outcome.error})"
    if outcome.status != 200:
        return f"NOT RETRIED: {outcome.status}"  # some endpoint was up all along
    spec = outcome.spec
    return _check_stream(spec, outcome.body) if spec.stream else _check_whole(spec, outcome.body)


def _check_whole(spec: Spec, body: bytes) -> str:
    try:
        answer = json.loads(body)
        choice = answer["choices"][0]
        text = choice["message"]["content"] if spec.chat else choice["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "bad whole answer"
    return "whole" if text == spec.text() else "bad whole answer: wrong text"


def _check_stream(spec: Spec, body: bytes) -> str:
    events = [e for e in body.split(b"\n\n") if e.strip()]
    if not events or not all(e.startswith(b"data: ") for e in events):
        return "bad stream: not SSE"
    if events[-1] == b"data: [DONE]":
        datas = [json.loads(e[6:]) for e in events[:-1]]
        usage = [d for d in datas if d.get("usage") and not d.get("choices")]
        if _text(spec, datas) != spec.text():
            return "bad stream: wrong text"
        if len(usage) != (1 if spec.usage else 0):
            return "bad stream: usage chunk"
        return "stream whole"
    if b"[DONE]" in body:
        return "bad stream: [DONE] before the end"
    datas = [json.loads(e[6:]) for e in events]
    error = datas[-1].get("error")
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
        return "bad stream: cut without an error event"
    if not spec.text().startswith(_text(spec, datas[:-1])):
        return "bad stream: wrong text before the cut"
    return f"stream cut ({error['code']})"


def _text(spec: Spec, datas: list[dict[str, Any]]) -> str:
    pieces = []
    for data in datas:
        for choice in data.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") if spec.chat else choice.get("text")
            pieces.append(piece or "")
    return "".join(pieces)


def _slow(outcome: Outcome) -> bool:
    """Lost at the client, or slower than :data:`SLOW_S` (each should take well under 1 s)."""
    return outcome.error is not None or outcome.ended - outcome.started > SLOW_S


async def _evidence(ridge: Server, engines: list[KillableEngine],
                    suspects: list[Outcome]) -> list[str]:
    """For a failure message: ridge's gauges and counts now, and for each lost or slow
    request (at most 5) which engines received it and ridge's log lines about it."""
    async with aiohttp.ClientSession() as http:
        samples = await gauges(http, ridge.url)
    lines = [f"ridge now: requests by status {by_status(samples)}, in flight "
             f"{ {n: [v for _, v in samples.get(n, [])] for n in IN_FLIGHT_GAUGES} }"]
    log = ridge.log_path.read_text(errors="replace").splitlines()
    for outcome in suspects[:5]:
        spec = outcome.spec
        asked = f"(question {spec.index})".encode()
        received = [sum(asked in body for body in e.bodies) for e in engines]
        named = re.compile(re.escape(spec.request_id) + r"\b")
        said = [line[:300] for line in log if named.search(line)][:10]
        lines.append(f"{spec.request_id} ({outcome.ended - outcome.started:.1f} s): received "
                     f"by the engines {received}; ridge's log: {said or 'nothing'}")
    return lines


# -- the test --------------------------------------------------------------------------------


async def test_engines_killed_and_restarted_under_load_lose_no_request(
        engines: list[KillableEngine], ridge: Server) -> None:
    timeline, progress = Timeline(), Progress()
    watcher = asyncio.create_task(watch(ridge.url, engines, timeline, progress))
    chaos_task = asyncio.create_task(chaos(engines, ridge.url, random.Random(SEED + 1),
                                           progress, timeline))
    try:
        outcomes = await run_load(ridge.url, plan(random.Random(SEED)), progress, timeline)
    finally:
        log = await chaos_task
        await watcher
    tally = Tally()
    for outcome in outcomes:
        check(outcome, tally, timeline)
    cut = sum(n for kind, n in tally.kinds.items() if kind.startswith("stream cut"))
    summary = (f"{len(outcomes)} requests {dict(tally.kinds)}; {log.events} kill events, "
               f"{log.kills} endpoint kills ({log.resets} with a reset, {log.doubles} double, "
               f"{log.with_streams} events with a stream under way)")
    print(f"\nchaos: {summary}")
    assert len(outcomes) == REQUESTS
    if tally.problems:
        evidence = await _evidence(ridge, engines, [o for o in outcomes if _slow(o)])
        raise AssertionError("\n".join([summary, *tally.problems[:20], *evidence,
                                        "timeline:", timeline.text()]))
    assert log.kills >= MIN_KILLS, timeline.text()
    assert cut >= 1, f"no stream was cut: {summary}\n{timeline.text()}"
    # ridge counts what clients saw: a cut stream is its 502, every other request a 200
    counted = {"200": tally.kinds["whole"] + tally.kinds["stream whole"], "502": cut}
    async with aiohttp.ClientSession() as http:
        after = await wait_for_gauges(
            http, ridge.url, lambda s: routable(s, engines) == set(range(ENGINES))
            and nothing_in_flight(s) and by_status(s) == counted,
            f"every endpoint up, nothing in flight and requests by status {counted}")
        print(f"ridge: retries {after.get('ridge_upstream_retries_total')}, requests "
              f"{by_status(after)}")
        for spec in (Spec(REQUESTS, True, False, False, 4, TOPICS[0]),
                     Spec(REQUESTS + 1, True, True, False, 4, TOPICS[1])):
            served = await send(http, ridge.url, spec)
            assert _kind(served) in ("whole", "stream whole"), served
    assert ridge.alive(), ridge.log_tail()
    assert "Traceback" not in ridge.log_path.read_text(), ridge.log_tail(80)
