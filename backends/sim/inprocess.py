"""A simulated fleet without HTTP: a fleet file's engines as objects, reached by URL.

:func:`start_in_process` builds one :class:`~backends.sim.endpoint.SimEndpoint` per endpoint
URL of the fleet, as :func:`backends.sim.fleet.start_fleet` does, but binds no port: the
gateway reaches them through :class:`InProcessClient` (its
:class:`~backends.upstream.client.BackendClient`) and :class:`InProcessProbe` (its registry's
:class:`~backends.engines.probe.MetricsSource`). Answers are the bytes the HTTP server writes
(:func:`backends.sim.wire.whole_answer`, :func:`backends.sim.wire.stream_events`); a client
that closes a stream early aborts its request in the engine, as a closed connection does.

On a :class:`~backends.sim.virtual_loop.VirtualTimeLoop` with a
:class:`~backends.sim.clock.LoopClock` the whole fleet runs on virtual time, with no socket
and no sleeping: the planner's evaluations (docs/planning.md). Served: the chat and completion
APIs (P/D pairs included: the KV transfer goes through the fleet's hub); anything else answers
404. Not modelled: faults, KV-cache events, connection limits.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from backends.engines.dialects import EngineDialect
from backends.engines.facts import Facts, Pages, fact_table, read_facts
from backends.engines.probe import ProbeError
from backends.engines.scrape import MetricsParseError, normalise
from backends.engines.tokenizers import fleet_tokenizers, pool_tokenizer
from backends.sim import shapes
from backends.sim.clock import Clock
from backends.sim.endpoint import SimEndpoint
from backends.sim.openai_api import ApiError, read_body
from backends.sim.pd import KVTransferHub
from backends.sim.runner import RequestHandle
from backends.sim.wire import stream_events, whole_answer
from backends.upstream.client import (
    UpstreamConnectError,
    UpstreamResponse,
    UpstreamStreamError,
    read_capped,
    too_large,
)
from config.fleet import Fleet, FleetConfigError
from routing.snapshots import EngineMetrics

KINDS: Mapping[str, shapes.Kind] = MappingProxyType({
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
})
"""The generation paths served, and the kind of request each takes."""
JSON_HEADERS: Mapping[str, str] = MappingProxyType({"content-type": "application/json"})
SSE_HEADERS: Mapping[str, str] = MappingProxyType(
    {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"})


@dataclass(eq=False)
class InProcessFleet:
    """The started engines by base URL (``scheme://host:port``), on one clock and hub."""

    endpoints: dict[str, SimEndpoint]
    clock: Clock
    hub: KVTransferHub
    coalesce: bool = False

    def endpoint(self, url: str) -> SimEndpoint:
        """The engine ``url`` (any path on it) reaches; :class:`UpstreamConnectError` when
        no engine listens there."""
        found = self.endpoints.get(base_url(url))
        if found is None:
            raise UpstreamConnectError(f"no simulated engine at {base_url(url)}")
        return found

    def client(self) -> InProcessClient:
        return InProcessClient(self)

    def probe(self) -> InProcessProbe:
        return InProcessProbe(self)

    async def stop(self) -> None:
        for ep in self.endpoints.values():
            await ep.runner.stop()


def base_url(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def start_in_process(fleet: Fleet, *, seed: int = 0, clock: Clock,
                     coalesce: bool = False) -> InProcessFleet:
    """Every endpoint of ``fleet`` as an engine of its own, its loop started (on the running
    event loop). ``coalesce``: streams send their first step's event, then the rest in one
    when done (:func:`~backends.sim.wire.stream_events`). A pool with ``kv_events`` is refused
    (:class:`FleetConfigError`): its events travel over sockets."""
    hub = KVTransferHub()
    tokenizers = fleet_tokenizers(fleet, report=False)
    running = InProcessFleet({}, clock, hub, coalesce)
    for pool in fleet.pools:
        if pool.kv_events is not None:
            raise FleetConfigError(f"pool {pool.name!r}: kv_events need the engines' sockets; "
                                   "an in-process fleet has none")
        tokenizer = pool_tokenizer(pool, tokenizers)
        for index, url in enumerate(pool.endpoint_urls()):
            port = urlsplit(url).port or 80
            endpoint = SimEndpoint(pool, index, port, clock, hub, seed, tokenizer)
            running.endpoints[base_url(url)] = endpoint
    for endpoint in running.endpoints.values():
        endpoint.runner.start()
    return running


class InProcessClient:
    """:class:`~backends.upstream.client.BackendClient` over an :class:`InProcessFleet`."""

    def __init__(self, fleet: InProcessFleet) -> None:
        self._fleet = fleet

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        ep = self._fleet.endpoint(url)
        kind = KINDS.get(urlsplit(url).path)
        if kind is None:
            return _Whole(404, shapes.error_body(ep.dialect, ApiError(404, "Not Found")))
        try:
            payload = read_body(body, ep.dialect)
            gen = ep.parse(kind, payload)
            intent = ep.intent(payload)
        except ApiError as err:
            return _Whole(err.status, shapes.error_body(ep.dialect, err))
        rid = ep.new_id(kind)
        handle = ep.submit(gen, rid, intent)
        head = shapes.head(rid, int(time.time()), gen.model)
        if gen.stream:
            events = stream_events(ep, gen, handle, head, coalesce=self._fleet.coalesce)
            return _Stream(ep, handle, events)
        try:
            pieces, finish = await handle.collect()
        finally:
            ep.runner.abort(handle)
        return _Whole(*whole_answer(ep, gen, handle, head, intent, pieces, finish))

    async def aclose(self) -> None:
        return None


class _Whole:
    """A non-streamed answer, whole when its headers are (as the HTTP server sends it)."""

    closes_at_once = True

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.headers = JSON_HEADERS
        self._body = shapes.dumps(body).encode()

    async def read(self, limit: int | None = None) -> bytes:
        if limit is not None and len(self._body) > limit:
            raise too_large(limit)
        return self._body

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def close(self) -> None:
        return None


class _Stream:
    """A streamed answer: its headers at once, its events as the engine steps."""

    status = 200
    headers = SSE_HEADERS
    closes_at_once = True

    def __init__(self, ep: SimEndpoint, handle: RequestHandle,
                 events: AsyncIterator[bytes]) -> None:
        self._ep, self._handle, self._events = ep, handle, events

    async def read(self, limit: int | None = None) -> bytes:
        if limit is None:
            return b"".join([event async for event in self._events])
        try:
            return await read_capped(self._events, limit)
        except UpstreamStreamError:
            await self.close()
            raise

    def chunks(self) -> AsyncIterator[bytes]:
        return self._events

    async def close(self) -> None:
        """Before the end this aborts the request in the engine (a closed connection)."""
        self._ep.runner.abort(self._handle)


class InProcessProbe:
    """:class:`~backends.engines.probe.MetricsSource` over an :class:`InProcessFleet`: the
    pages the HTTP server would answer, read without HTTP."""

    def __init__(self, fleet: InProcessFleet) -> None:
        self._fleet = fleet

    async def health(self, url: str, dialect: EngineDialect) -> bool:
        return not self._engine(url).faults.active("unhealthy")

    async def metrics(self, url: str, dialect: EngineDialect) -> EngineMetrics:
        try:
            page = self._engine(url).metrics_text(dialect.metric_names())
            return normalise(page, dialect)
        except MetricsParseError as exc:
            raise ProbeError(url, f"page does not parse: {exc}") from exc

    async def facts(self, url: str, dialect: EngineDialect) -> Facts:
        ep = self._engine(url)
        models = shapes.models_body(ep.dialect, ep.info, int(ep.started),
                                    f"modelperm-{ep.engine_id}")
        pages = Pages(ep.metrics_text(), None, json.loads(shapes.dumps(models)))
        return read_facts(fact_table(dialect.engine), pages)

    def _engine(self, url: str) -> SimEndpoint:
        try:
            return self._fleet.endpoint(url)
        except UpstreamConnectError as exc:
            raise ProbeError(url, str(exc)) from None
