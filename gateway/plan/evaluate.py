"""One candidate fleet serving one trace on virtual time: ridge's own gateway, no HTTP.

:func:`evaluate` runs the gateway ridge serves (:func:`gateway.app.create_app`: its router,
router state, admission and telemetry, on the loop's clock) in front of the candidate's
simulated engines (:mod:`backends.sim.inprocess`), all on one
:class:`~backends.sim.virtual_loop.VirtualTimeLoop`: requests go in through the ASGI interface,
the engines are reached through the in-process client, and time jumps from one event to the
next, so a replay takes the CPU its events take and no wall time besides. Nothing of the
scheduling, routing or admission is written again here.

Each trace record becomes a streamed chat completion of its prompt
(:class:`~gateway.plan.trace.BlockTexts`) for exactly ``output_length`` tokens, sent at its
timestamp divided by ``scale`` (what-if load: ×k arrivals). Per request the client's view is
kept: status, TTFT and TPOT [s] on the virtual clock, the pool ridge chose. See
docs/planning.md#how-a-candidate-is-evaluated.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from backends.sim.clock import LoopClock
from backends.sim.inprocess import InProcessFleet, start_in_process
from backends.sim.virtual_loop import run
from config.fleet import Fleet
from gateway.app import RidgeApp, create_app
from gateway.plan.trace import BlockTexts, TraceEntry
from gateway.settings import Settings

log = logging.getLogger("ridge.plan")

CHAT_PATH = "/v1/chat/completions"
NEVER_S = 1e9
"""[s] A timeout that never expires in a replay."""
HEADERS = ((b"content-type", b"application/json"), (b"host", b"ridge-plan"))


@dataclass(frozen=True, slots=True)
class Served:
    """One request as its client saw it. Times [s, virtual]; ``pool``: ridge's choice ("" when
    refused); ``ttft_s``/``tpot_s`` None when no token came (a refusal, an error)."""

    index: int
    status: int
    pool: str
    prompt_tokens: int
    output_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float


@dataclass(frozen=True, slots=True)
class PoolCounters:
    """One pool's engines summed over the run: prompt tokens looked up in the prefix cache and
    found there, FLOPs done and bytes read from memory."""

    queried_tokens: int
    hit_tokens: int
    flops: float
    read_bytes: float


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A candidate's replay: every request, each pool's engine counters, the span [s] from
    the first arrival to the last answer, the window [s] from the first arrival to the last
    (the offered load's), and per pool the binding walls the gateway named
    (``ridge_pool_binding_wall``) at each scrape while the pool had traffic, counted."""

    served: tuple[Served, ...]
    pools: dict[str, PoolCounters]
    span_s: float
    window_s: float
    walls: dict[str, dict[str, int]]


SCRAPE_S = 15.0
"""[s, virtual] How often the binding walls are read: Prometheus's default scrape interval."""
WALL_FAMILY = "ridge_pool_binding_wall"


def evaluate(fleet: Fleet, entries: Sequence[TraceEntry], *, settings: Settings,
             seed: int = 0, scale: float = 1.0, every_step: bool = False) -> Evaluation:
    """Replay ``entries`` (sorted by time) through ridge in front of ``fleet``'s simulated
    engines on virtual time, arrivals ``scale`` times as dense, for the first pool's model.
    Streams carry their first step's tokens, then the rest at the end (``every_step``: one
    event per engine step, as on the wire; the same times, many more wake-ups), so the
    gateway's stream idle timeout is lifted when they do."""
    if scale <= 0:
        raise ValueError("scale must be positive")
    if not every_step:
        upstream = settings.upstream.model_copy(update={"stream_idle_timeout_s": NEVER_S})
        settings = settings.model_copy(update={"upstream": upstream})
    return run(_evaluate(fleet, entries, settings, seed, scale, not every_step))


async def _evaluate(fleet: Fleet, entries: Sequence[TraceEntry], settings: Settings,
                    seed: int, scale: float, coalesce: bool) -> Evaluation:
    model = fleet.pools[0].models[0]
    engines = start_in_process(fleet, seed=seed, clock=LoopClock(), coalesce=coalesce)
    loop = asyncio.get_running_loop()
    metrics = CollectorRegistry()
    app = create_app(settings, fleet, metrics_registry=metrics,
                     client_factory=lambda _: engines.client(),
                     probe_factory=lambda _s, _l, _t, _h: engines.probe(), clock=loop.time)
    texts = BlockTexts(seed)
    try:
        async with _Lifespan(app):
            start = loop.time()
            zero = entries[0].timestamp_ms if entries else 0.0
            walls: dict[str, dict[str, int]] = {p.name: {} for p in fleet.pools}
            scraper = asyncio.create_task(_scrape_walls(metrics, engines, walls))
            served = await asyncio.gather(*(
                _send(app, i, e, texts, model, start + (e.timestamp_ms - zero) / 1000.0 / scale)
                for i, e in enumerate(entries)))
            span = loop.time() - start
            scraper.cancel()
    finally:
        await engines.stop()
    window = (entries[-1].timestamp_ms - zero) / 1000.0 / scale if entries else 0.0
    return Evaluation(tuple(served), _pool_counters(engines), span, window, walls)


async def _scrape_walls(metrics: CollectorRegistry, engines: InProcessFleet,
                        walls: dict[str, dict[str, int]]) -> None:
    """Count, every :data:`SCRAPE_S`, the wall the gateway names for each pool that ran a
    request since the last scrape."""
    seen = {name: 0 for name in walls}
    while True:
        await asyncio.sleep(SCRAPE_S)
        now = _requests_by_pool(engines)
        busy = {name for name, n in now.items() if n > seen.get(name, 0)}
        seen = now
        for family in metrics.collect():
            if family.name != WALL_FAMILY:
                continue
            for sample in family.samples:
                pool, wall = sample.labels["pool"], sample.labels["wall"]
                if sample.value == 1.0 and pool in busy:
                    walls[pool][wall] = walls[pool].get(wall, 0) + 1


def _requests_by_pool(engines: InProcessFleet) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ep in engines.endpoints.values():
        counts[ep.pool.name] = counts.get(ep.pool.name, 0) + ep.core.stats.requests_received
    return counts


def _pool_counters(engines: InProcessFleet) -> dict[str, PoolCounters]:
    totals: dict[str, list[float]] = {}
    for ep in engines.endpoints.values():
        st = ep.core.stats
        row = totals.setdefault(ep.pool.name, [0, 0, 0.0, 0.0])
        row[0] += st.prefix_queries
        row[1] += st.prefix_hits
        row[2] += st.flops
        row[3] += st.read_bytes
    return {name: PoolCounters(int(q), int(h), f, b) for name, (q, h, f, b) in totals.items()}


def request_body(entry: TraceEntry, texts: BlockTexts, model: str) -> bytes:
    """The chat completion a trace record becomes (module docstring)."""
    output = max(1, entry.output_length)
    return json.dumps({
        "model": model, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": output, "min_tokens": output, "ignore_eos": True,
        "messages": [{"role": "user", "content": texts.prompt(entry)}],
    }).encode()


async def _send(app: RidgeApp, index: int, entry: TraceEntry, texts: BlockTexts, model: str,
                at: float) -> Served:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(at - loop.time())
    body = request_body(entry, texts, model)
    start = loop.time()
    exchange = _Exchange(body)
    await app(_scope(len(body)), exchange.receive, exchange.send)
    exchange.done.set()
    end = loop.time()
    ttft = None if exchange.first is None else exchange.first - start
    tpot = None
    if exchange.first is not None and exchange.last is not None and entry.output_length > 1:
        tpot = (exchange.last - exchange.first) / (entry.output_length - 1)
    ok = exchange.status == 200 and exchange.first is not None
    return Served(index, exchange.status, exchange.pool, entry.input_length,
                  entry.output_length if ok else 0, ttft if ok else None,
                  tpot if ok else None, end - start)


def _scope(length: int) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": CHAT_PATH, "raw_path": CHAT_PATH.encode(),
            "query_string": b"", "root_path": "",
            "headers": [*HEADERS, (b"content-length", str(length).encode())],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}


class _Exchange:
    """The client's side of one ASGI request: its body, then the times of the answer's first
    and last body piece [virtual s], its status and the pool of ``x-ridge-route``."""

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body
        self.done = asyncio.Event()
        self.status = 0
        self.pool = ""
        self.first: float | None = None
        self.last: float | None = None

    async def receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.done.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            for name, value in message.get("headers", ()):
                if name == b"x-ridge-route":
                    self.pool = _pool_of(value.decode())
        elif message["type"] == "http.response.body" and message.get("body") \
                and self.status == 200:
            now = asyncio.get_running_loop().time()
            self.first = now if self.first is None else self.first
            self.last = now


def _pool_of(route: str) -> str:
    for part in route.split(";"):
        key, _, value = part.strip().partition("=")
        if key == "pool":
            return value
    return ""


class _Lifespan:
    """The app's ASGI lifespan: started on entry, shut down on exit."""

    def __init__(self, app: RidgeApp) -> None:
        self._app = app
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Lifespan:
        self._task = asyncio.create_task(self._app(
            {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
            self._inbox.get, self._put))
        await self._step("startup")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._step("shutdown")
        assert self._task is not None
        await self._task

    async def _put(self, message: MutableMapping[str, Any]) -> None:
        await self._outbox.put(dict(message))

    async def _step(self, phase: str) -> None:
        await self._inbox.put({"type": f"lifespan.{phase}"})
        answer = await self._outbox.get()
        if answer["type"] != f"lifespan.{phase}.complete":
            raise RuntimeError(f"the gateway did not {phase}: {answer.get('message', answer)}")
