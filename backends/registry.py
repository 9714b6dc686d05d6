"""The endpoint registry: live state of every engine endpoint, and the poller that refreshes it.

:class:`EndpointRegistry` is built from a :class:`backends.fleet_file.Fleet` and holds, per
endpoint: healthy flag, the last :class:`EngineMetrics`, the last error, consecutive health
failures and the time of the last poll. The router reads it through
:meth:`EndpointRegistry.snapshot` (frozen :class:`PoolSnapshot` objects, rebuilt only after a
poll or a failure changed something). The gateway's in-flight requests are not counted here:
the router state's reservations are the one count (:mod:`routing.load`). The app creates one
registry; there is no module-level state. It is meant for one asyncio event loop and is not
thread-safe.

Health rules (the decisions, in one place):
- an endpoint starts *unhealthy* (state unknown) and becomes healthy on its first successful
  health probe; the app awaits :meth:`Poller.wait_until_polled` (bounded) at start-up so the
  first request sees real health;
- a failed or unreachable health probe marks it unhealthy at once; the next successful probe
  brings it back by itself;
- :meth:`EndpointRegistry.mark_failed` (passive health: a proxied request could not connect)
  marks it unhealthy until a poll *started after* the failure sees it healthy again, so a
  probe already in flight cannot undo a newer failure;
- a circuit breaker per endpoint (:class:`BreakerConfig`) catches an engine whose health probe
  passes while its real requests fail, which the rule above would let back in at every poll.
  It counts consecutive request failures (:meth:`~EndpointRegistry.mark_failed`); a request
  that succeeded (:meth:`~EndpointRegistry.mark_succeeded`) resets the count. *Closed*:
  ``failures`` consecutive failures open it. *Open* for ``open_s`` seconds: the endpoint is
  unhealthy whatever the probes say (a passive failure dated at the end of the period, so only
  a probe started after it counts). *Half-open*, once the period is over: the endpoint is
  routable again when such a probe succeeds, and the first request outcome decides:
  a success closes the breaker (count 0, open time back to ``open_s``), a failure reopens it at
  once for twice the last open time, at most ``max_open_s``. A success reported while it is
  open (a request sent before it opened) changes nothing;
- health OK but the metrics scrape failed: the endpoint stays healthy and keeps its previous
  metrics (one bad scrape should not move traffic), and the error is recorded. Metrics older
  than ``metrics_ttl_s`` are no longer shown in snapshots (shown as unknown) so a scrape that
  keeps failing cannot pin stale load figures forever.

Poller parameters: ``interval_s``, the time between the starts of two poll rounds (a round
probes every endpoint concurrently, health then metrics; each probe is bounded by the
MetricsSource's own timeout).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from backends.dialects import EngineDialect, dialect_for
from backends.fleet_file import Fleet, Pool, pool_levers
from backends.probe import MetricsSource, ProbeError
from routing.fleet_math import decode_ridge_tokens
from routing.snapshots import EndpointSnapshot, EngineMetrics, PoolSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PollResult:
    """What one poll of one endpoint found. ``started_at`` is on the registry's clock."""

    started_at: float
    healthy: bool
    metrics: EngineMetrics | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """The circuit breaker of every endpoint (rules in the module docstring).

    ``failures``: consecutive failed requests that open it (>= 1); ``open_s``: the first open
    time [s]; ``max_open_s``: the cap of the open time, doubled at each reopening [s] (it caps
    the first open time too).
    """

    failures: int = 3
    open_s: float = 5.0
    max_open_s: float = 60.0

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError("breaker failures must be at least 1")
        if not (self.open_s > 0 and self.max_open_s > 0):
            raise ValueError("breaker open times must be positive")

    def next_open_s(self, last_open_s: float | None) -> float:
        """The open time after ``last_open_s`` (None: the breaker was closed) [s]."""
        return min(self.max_open_s, self.open_s if last_open_s is None else 2 * last_open_s)


class CircuitState(Enum):
    """Where an endpoint's circuit breaker stands (rules in the module docstring)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    """Everything the registry knows about one endpoint (for admin pages and tests).

    ``consecutive_failures`` counts failed probes and requests since the last good probe;
    ``request_failures`` counts failed requests since the last successful one (the breaker's
    count); ``circuit_open_until``: when the breaker's open period ends (None: closed).
    """

    url: str
    pool: str
    healthy: bool
    metrics: EngineMetrics
    last_error: str | None
    consecutive_failures: int
    last_poll_at: float | None
    metrics_at: float | None
    circuit: CircuitState = CircuitState.CLOSED
    request_failures: int = 0
    circuit_open_until: float | None = None


@dataclass(slots=True)
class _Endpoint:
    url: str
    pool: str
    dialect: EngineDialect
    healthy: bool = False
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    metrics_at: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    last_poll_at: float | None = None
    failed_at: float = -math.inf
    request_failures: int = 0  # the breaker's count; > 0 whenever the breaker is not closed
    open_until: float | None = None  # end of the breaker's open period; None: closed
    open_s: float | None = None  # length of that period [s]

    def circuit(self, now: float) -> CircuitState:
        if self.open_until is None:
            return CircuitState.CLOSED
        return CircuitState.OPEN if now < self.open_until else CircuitState.HALF_OPEN


class EndpointRegistry:
    """Live state of the fleet's endpoints. Parameters: ``metrics_ttl_s`` (None = no expiry),
    ``breaker`` (every endpoint's circuit breaker), ``clock`` (seconds, monotonic; injected by
    tests)."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        metrics_ttl_s: float | None = 30.0,
        breaker: BreakerConfig = BreakerConfig(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pools: tuple[Pool, ...] = tuple(fleet.pools)
        self._endpoints: dict[str, _Endpoint] = {
            url: _Endpoint(url, pool.name, dialect_for(pool.engine))
            for pool in fleet.pools
            for url in pool.endpoint_urls()
        }
        self._metrics_ttl_s = metrics_ttl_s
        self._breaker = breaker
        self._clock = clock
        self._cached: tuple[PoolSnapshot, ...] | None = None
        self._cached_until = -math.inf

    @property
    def urls(self) -> tuple[str, ...]:
        """Every endpoint URL, in fleet order."""
        return tuple(self._endpoints)

    def now(self) -> float:
        """The registry's clock (seconds)."""
        return self._clock()

    def dialect_of(self, url: str) -> EngineDialect:
        return self._get(url).dialect

    def _get(self, url: str) -> _Endpoint:
        try:
            return self._endpoints[url]
        except KeyError:
            raise KeyError(f"unknown endpoint {url!r}") from None

    def _changed(self) -> None:
        self._cached = None

    # -- the router's view ------------------------------------------------------------------

    def snapshot(self) -> tuple[PoolSnapshot, ...]:
        """Frozen pools as the router sees them now; cached until something changes."""
        now = self._clock()
        if self._cached is None or now >= self._cached_until:
            self._cached = tuple(self._pool_snapshot(pool, now) for pool in self._pools)
            self._cached_until = self._next_expiry(now)
        return self._cached

    def _pool_snapshot(self, pool: Pool, now: float) -> PoolSnapshot:
        endpoints = tuple(
            self._endpoint_snapshot(self._endpoints[u], now) for u in pool.endpoint_urls()
        )
        return PoolSnapshot(
            name=pool.name,
            engine=pool.engine.value,
            role=pool.role.value,
            models=tuple(pool.models),
            endpoints=endpoints,
            levers=pool_levers(pool),
            pair=pool.pair,
            ridge_tokens=decode_ridge_tokens(
                pool.hardware.peak_flops, pool.hardware.mem_bandwidth, pool.model.dtype_bytes
            ),
            chunk_tokens=pool.levers.chunked_prefill.token_budget
            if pool.levers.chunked_prefill and pool.levers.chunked_prefill.enabled
            else None,
            draft_tokens=pool.levers.speculative.num_draft_tokens
            if pool.levers.speculative else 0,
        )

    def _endpoint_snapshot(self, ep: _Endpoint, now: float) -> EndpointSnapshot:
        return EndpointSnapshot(ep.url, ep.pool, ep.healthy, self._shown_metrics(ep, now))

    def _shown_metrics(self, ep: _Endpoint, now: float) -> EngineMetrics:
        if ep.metrics_at is None or self._metrics_ttl_s is None:
            return ep.metrics
        return ep.metrics if now - ep.metrics_at <= self._metrics_ttl_s else EngineMetrics()

    def _next_expiry(self, now: float) -> float:
        """When a cached snapshot stops being true because some metrics expire."""
        if self._metrics_ttl_s is None:
            return math.inf
        ends = [
            ep.metrics_at + self._metrics_ttl_s
            for ep in self._endpoints.values()
            if ep.metrics_at is not None
        ]
        return min((end for end in ends if end >= now), default=math.inf)

    def status(self, url: str) -> EndpointStatus:
        ep = self._get(url)
        return EndpointStatus(
            url=ep.url,
            pool=ep.pool,
            healthy=ep.healthy,
            metrics=ep.metrics,
            last_error=ep.last_error,
            consecutive_failures=ep.consecutive_failures,
            last_poll_at=ep.last_poll_at,
            metrics_at=ep.metrics_at,
            circuit=ep.circuit(self._clock()),
            request_failures=ep.request_failures,
            circuit_open_until=ep.open_until,
        )

    def models_available(self) -> list[str]:
        """Sorted union of the models of every pool with at least one healthy endpoint."""
        models: set[str] = set()
        for pool in self._pools:
            if any(self._endpoints[u].healthy for u in pool.endpoint_urls()):
                models.update(pool.models)
        return sorted(models)

    # -- health ---------------------------------------------------------------------------------

    def mark_failed(self, url: str, reason: str) -> None:
        """Passive health: a proxied request to ``url`` failed; unhealthy until re-polled, and
        one more failure for its circuit breaker (which may open or reopen it)."""
        ep = self._get(url)
        now = self._clock()
        ep.healthy = False
        ep.last_error = reason
        ep.consecutive_failures += 1
        ep.failed_at = max(ep.failed_at, now)  # never shortens an open breaker's period
        ep.request_failures += 1
        if self._trips(ep, now):
            self._open(ep, now, reason)
        self._changed()

    def mark_succeeded(self, url: str) -> None:
        """A proxied request to ``url`` succeeded: reset its breaker's count, or close a
        half-open breaker. On every request's path: nothing but a lookup and a test when the
        count is 0 (then the breaker is closed), and never a snapshot rebuild."""
        ep = self._get(url)
        if ep.request_failures == 0:
            return
        if ep.open_until is None:
            ep.request_failures = 0
        elif self._clock() >= ep.open_until:
            self._close(ep)

    def _trips(self, ep: _Endpoint, now: float) -> bool:
        """Whether the failure just counted opens the breaker: the count reached ``failures``
        while closed, or the breaker was half-open (a failure while open changes nothing)."""
        if ep.open_until is None:
            return ep.request_failures >= self._breaker.failures
        return now >= ep.open_until

    def _open(self, ep: _Endpoint, now: float, reason: str) -> None:
        ep.open_s = self._breaker.next_open_s(ep.open_s)
        ep.open_until = now + ep.open_s
        ep.failed_at = ep.open_until  # only a probe started after the period brings it back
        log.warning("endpoint %s (pool %s): circuit breaker open for %.1f s after %d "
                    "consecutive failed requests (last: %s)",
                    ep.url, ep.pool, ep.open_s, ep.request_failures, reason)

    def _close(self, ep: _Endpoint) -> None:
        ep.request_failures, ep.open_until, ep.open_s = 0, None, None
        log.info("endpoint %s (pool %s): circuit breaker closed, a request succeeded",
                 ep.url, ep.pool)

    def record_poll(self, url: str, result: PollResult) -> None:
        """Apply one poll's findings (the rules are in the module docstring)."""
        ep = self._get(url)
        ep.last_poll_at = self._clock()
        if result.metrics is not None:
            ep.metrics = result.metrics
            ep.metrics_at = ep.last_poll_at
        if not result.healthy:
            ep.healthy = False
            ep.consecutive_failures += 1
            ep.last_error = result.error
        elif result.started_at >= ep.failed_at:
            ep.healthy = True
            ep.consecutive_failures = 0
            ep.last_error = result.error
        self._changed()


class Poller:
    """Refreshes a registry from a :class:`MetricsSource` every ``interval_s`` seconds."""

    def __init__(
        self, registry: EndpointRegistry, source: MetricsSource, interval_s: float = 1.0
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._registry = registry
        self._source = source
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._polled = asyncio.Event()

    async def poll_once(self) -> None:
        """Probe every endpoint once, concurrently, and record what was found."""
        await asyncio.gather(*(self._poll_endpoint(url) for url in self._registry.urls))
        self._polled.set()

    async def _poll_endpoint(self, url: str) -> None:
        result = await self._probe(url, self._registry.dialect_of(url))
        self._registry.record_poll(url, result)

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
