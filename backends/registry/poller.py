"""The poller: refreshes an endpoint registry from a MetricsSource, one round every
``interval_s`` seconds.

A round (:meth:`Poller.poll_once`) resolves the ``resolve: dns`` pools (``resolver``, a
:class:`~backends.registry.resolver.DnsResolver`), probes every endpoint of a pool
concurrently — health, then metrics, then the facts of an endpoint that just became healthy,
each probe bounded by the MetricsSource's own timeout —, records what each probe found
(:class:`~backends.registry.status.PollResult`), then lets the idle drained endpoints go
(``in_flight``: the router state's reservations, for the drain; None: no request is ever in
flight). ``interval_s`` is the time between the starts of two rounds [s]. One background task
at most (:meth:`Poller.start`, :meth:`Poller.stop`); the app awaits
:meth:`Poller.wait_until_polled` (bounded) at start-up so the first request sees real health.
The health rules are the registry's (:mod:`backends.registry.endpoints`); see
docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from backends.engines.dialects import EngineDialect
from backends.engines.probe import MetricsSource, ProbeError
from backends.registry.endpoints import EndpointRegistry
from backends.registry.operator_log import LOGGER, redacted
from backends.registry.resolver import DnsResolver
from backends.registry.status import PollResult
from config.pools import Pool
from routing.load import InFlight

log = logging.getLogger(LOGGER)


class Poller:
    """Refreshes a registry from a :class:`MetricsSource` every ``interval_s`` seconds
    (parameters in the module docstring)."""

    def __init__(
        self, registry: EndpointRegistry, source: MetricsSource, interval_s: float = 1.0, *,
        resolver: DnsResolver | None = None, in_flight: Callable[[], InFlight] | None = None,
        on_gone: Callable[[str], None] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._registry = registry
        self._source = source
        self._interval_s = interval_s
        self._resolver = resolver or DnsResolver()
        self._in_flight = in_flight
        self._on_gone = on_gone
        self._task: asyncio.Task[None] | None = None
        self._polled = asyncio.Event()

    async def poll_once(self) -> None:
        """Resolve the ``resolve: dns`` pools, probe every endpoint once, concurrently, record
        what was found, and let the idle drained endpoints go."""
        await self.resolve_pools()
        await self.probe(self._registry.active_urls)
        self.sweep()
        self._polled.set()

    def sweep(self) -> tuple[str, ...]:
        """Let the drained endpoints without a request in flight go (see
        :meth:`EndpointRegistry.sweep`), telling ``on_gone`` of each (the router state forgets
        the prefixes it recorded there: an address a new engine takes later holds none of
        them); their URLs."""
        gone = self._registry.sweep(self._in_flight() if self._in_flight is not None else None)
        if self._on_gone is not None:
            for url in gone:
                self._on_gone(url)
        return gone

    async def probe(self, urls: Iterable[str]) -> None:
        """Probe ``urls`` once, concurrently, and record what was found."""
        await asyncio.gather(*(self._poll_endpoint(url) for url in urls))

    async def resolve(self, pools: Iterable[Pool]) -> dict[str, tuple[str, ...]]:
        """The endpoints of the ``resolve: dns`` pools of ``pools``, looked up now."""
        return await self._resolver.resolve(pools)

    async def resolve_pools(self) -> None:
        """Look the registry's ``resolve: dns`` pools up and set their endpoints (not those of
        a pool a reload changed meanwhile)."""
        pools = self._registry.pools
        found = await self.resolve(pools)
        now = {p.name: p for p in self._registry.pools}
        for pool in pools:
            if pool.name in found and now.get(pool.name) is pool:
                self._registry.set_endpoints(pool.name, found[pool.name])

    async def _poll_endpoint(self, url: str) -> None:
        try:
            dialect = self._registry.dialect_of(url)
        except KeyError:
            return  # it left the registry meanwhile
        result = await self._probe(url, dialect)
        self._registry.record_poll(url, result)
        if self._registry.facts_due(url):
            await self._read_facts(url, dialect)

    async def _read_facts(self, url: str, dialect: EngineDialect) -> None:
        started = self._registry.now()
        try:
            facts = await self._source.facts(url, dialect)
        except Exception as exc:  # noqa: BLE001 - the check is advice; polling goes on
            log.warning("reading the engine facts of %s raised %s", redacted(url),
                        type(exc).__name__, exc_info=exc)
            facts = {}
        self._registry.record_facts(url, facts, started)

    async def _probe(self, url: str, dialect: EngineDialect) -> PollResult:
        started = self._registry.now()
        try:
            healthy = await self._source.health(url, dialect)
        except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
            return PollResult(started, healthy=False, error=_reason("health", exc))
        if not healthy:
            return PollResult(started, healthy=False, error="health: engine answered not ready")
        try:
            metrics = await self._source.metrics(url, dialect)
        except Exception as exc:  # noqa: BLE001 - keep the old metrics, stay healthy
            return PollResult(started, healthy=True, error=_reason("metrics", exc))
        return PollResult(started, healthy=True, metrics=metrics)

    async def wait_until_polled(self, timeout_s: float) -> bool:
        """Wait for the first complete poll round; False if ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self._polled.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def start(self) -> None:
        """Start polling in a background task (poll at once, then every ``interval_s``)."""
        if self._task is not None and not self._task.done():
            raise RuntimeError("poller already started")
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="ridge-endpoint-poller"
        )

    async def stop(self) -> None:
        """Cancel the background task and wait for it to end; safe to call twice."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait([task])  # a cancellation of our caller still reaches our caller
        if not task.cancelled():
            task.result()  # re-raise if the loop had crashed instead

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.poll_once()
            await asyncio.sleep(max(0.0, self._interval_s - (loop.time() - started)))

    async def __aenter__(self) -> Poller:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def _reason(what: str, exc: Exception) -> str:
    if isinstance(exc, ProbeError):
        return f"{what}: {exc.reason}"
    log.warning("%s probe raised %s", what, type(exc).__name__, exc_info=exc)
    return f"{what}: {type(exc).__name__}: {exc}"
