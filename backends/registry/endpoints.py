"""The endpoint registry: live state of every engine endpoint, and the poller that refreshes it.

:class:`EndpointRegistry` is built from a :class:`config.fleet_file.Fleet` and holds, per
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

Lever check: when an endpoint becomes healthy (the first time, and again after it was down)
the poller asks the MetricsSource once for what its engine says it runs
(:mod:`backends.engines.facts`), and :meth:`EndpointRegistry.record_facts` holds that against the
pool's declared levers (:mod:`backends.registry.lever_check`). Not at every poll: SGLang's facts
cost a
request of their own, and an engine's configuration changes only with a restart, which takes
longer than a poll interval (the model loads) so the probes see the endpoint down and up again.
Facts read while the endpoint went down are dropped. The endpoint's snapshot carries its
missing levers (:class:`~routing.snapshots.EndpointSnapshot`), its status the whole check.
The same read gives the LoRA adapters the engine lists as loaded (the ``adapters`` fact), which
the snapshot carries too; since an adapter can be loaded into a running engine (vLLM's
``/v1/load_lora_adapter``), a healthy endpoint's facts are also read again every
``facts_every_s`` seconds. The models the fleet serves (:meth:`EndpointRegistry.model_parents`)
are the base models and the adapters (declared, or listed by an engine) of the pools with a
healthy endpoint, each adapter with its base model.

Operator logs, one line per transition, never one per poll: an endpoint's first health verdict
and every change after it (WARNING ``endpoint URL (pool P) is down: REASON``; INFO ``... is up``
or ``... is back up after N s down``); its pool losing its last healthy endpoint (WARNING; at
start-up: having none) and getting one back (INFO); the circuit breaker opening (WARNING) and
closing (INFO); a lever mismatch once per (endpoint, lever) while it lasts (WARNING) and its
end (INFO). URLs and reasons are logged without any credentials a URL carries.

Endpoints that change at runtime. A pool's endpoint set changes in two ways: a ``resolve:
dns`` pool is looked up at the start of every poll round (:mod:`backends.registry.resolver`;
:meth:`EndpointRegistry.set_endpoints`), and a fleet reload applies a new fleet file
(:meth:`EndpointRegistry.apply_fleet`: pools added, removed or changed, endpoints added or
removed). An endpoint that joins starts unhealthy and unknown, like any at start-up, until a
probe passes. One that leaves *drains*: at once it is in no snapshot, so the router sends it
nothing new, while the requests in flight on it finish normally (their outcomes,
:meth:`mark_failed` and :meth:`mark_succeeded`, are taken and change nothing, and are ignored
once it is gone); it leaves the registry — its status, and every gauge read from here — at
the end of the first poll round that finds none of this gateway's requests on it (the router
state's in-flight reservations, :meth:`EndpointRegistry.sweep`), or ``drain_timeout_s`` after
it left, whatever is still in flight then. An endpoint that comes back while draining starts
afresh (unhealthy until probed). A draining endpoint is no longer probed. A URL another pool
holds is not taken (a WARNING names it). One INFO line per endpoint that joins, leaves or is
gone. :meth:`EndpointRegistry.watch` registers listeners told after every such change (the
gateway rebuilds what it keys by endpoint).

Poller parameters: ``interval_s``, the time between the starts of two poll rounds (a round
resolves the ``resolve: dns`` pools, probes every endpoint concurrently, health then metrics,
then the facts of an endpoint that just became healthy — each probe bounded by the
MetricsSource's own timeout —, then lets the idle drained endpoints go); ``resolver`` (the
:class:`~backends.registry.resolver.DnsResolver`); ``in_flight`` (the router state's reservations,
for
the drain; None: no request is ever in flight).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from backends.engines.dialects import EngineDialect, dialect_for
from backends.engines.facts import ADAPTERS, MAX_CONTEXT, Facts, LoadedAdapters
from backends.engines.probe import MetricsSource, ProbeError
from backends.registry.lever_check import LeverCheck, check_levers, declared_facts
from backends.registry.resolver import DNS, DnsResolver
from config.fleet_file import Fleet, Pool, pool_levers
from routing.formulas import decode_ridge_tokens
from routing.load import NO_LOAD, InFlight
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
class FleetChanges:
    """What applying a fleet (or a new endpoint set) changed: pools by name, endpoints by URL
    (``drained``: left their pool and draining now)."""

    pools_added: tuple[str, ...] = ()
    pools_removed: tuple[str, ...] = ()
    pools_changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return any((self.pools_added, self.pools_removed, self.pools_changed, self.added,
                    self.drained))


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
    count); ``circuit_open_until``: when the breaker's open period ends (None: closed);
    ``lever_check``: its engine's facts against the pool's levers (empty until read).
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
    lever_check: LeverCheck = LeverCheck()


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
    known: bool = False  # a health verdict was reached (healthy is no longer a default)
    down_at: float = -math.inf  # when it last became unhealthy
    facts_due: bool = True  # read its engine's facts when it is next healthy
    facts_at: float = -math.inf  # when its facts were last read
    lever_check: LeverCheck = field(default_factory=LeverCheck)
    adapters: LoadedAdapters = field(default_factory=LoadedAdapters)
    left_at: float | None = None  # when it left its pool (draining); None: in its pool

    def circuit(self, now: float) -> CircuitState:
        if self.open_until is None:
            return CircuitState.CLOSED
        return CircuitState.OPEN if now < self.open_until else CircuitState.HALF_OPEN


class EndpointRegistry:
    """Live state of the fleet's endpoints. Parameters: ``metrics_ttl_s`` (None = no expiry),
    ``breaker`` (every endpoint's circuit breaker), ``drain_timeout_s`` (the longest an
    endpoint that left its pool stays while requests are in flight on it [s]),
    ``facts_every_s`` (how often a healthy endpoint's engine facts are read again [s]; None =
    only when it becomes healthy), ``clock`` (seconds, monotonic; injected by tests). The
    endpoints of a ``resolve: dns`` pool are
    unknown until its first look-up."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        metrics_ttl_s: float | None = 30.0,
        breaker: BreakerConfig = BreakerConfig(),
        drain_timeout_s: float = 300.0,
        facts_every_s: float | None = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must not be negative")
        self._pools: tuple[Pool, ...] = tuple(fleet.pools)
        self._pool_urls = {pool.name: _written(pool) for pool in fleet.pools}
        self._endpoints: dict[str, _Endpoint] = {
            url: _Endpoint(url, pool.name, dialect_for(pool.engine))
            for pool in fleet.pools
            for url in self._pool_urls[pool.name]
        }
        self._declared = {pool.name: declared_facts(pool) for pool in fleet.pools}
        self._pool_up: dict[str, bool | None] = dict.fromkeys(self._pool_urls)
        self._metrics_ttl_s = metrics_ttl_s
        self._breaker = breaker
        self._drain_timeout_s = drain_timeout_s
        self._facts_every_s = facts_every_s
        self._clock = clock
        self._cached: tuple[PoolSnapshot, ...] | None = None
        self._cached_until = -math.inf
        self._listeners: list[Callable[[], None]] = []
        self._refused: set[tuple[str, str]] = set()

    @property
    def urls(self) -> tuple[str, ...]:
        """Every endpoint URL the registry holds: its pools', in fleet order, then the
        draining ones."""
        return (*self.active_urls, *self.draining)

    @property
    def active_urls(self) -> tuple[str, ...]:
        """The URLs of the pools' endpoints now (what is probed), in fleet order."""
        return tuple(u for pool in self._pools for u in self._pool_urls[pool.name])

    @property
    def draining(self) -> tuple[str, ...]:
        """The endpoints that left their pool and are still here (module docstring)."""
        return tuple(u for u, ep in self._endpoints.items() if ep.left_at is not None)

    @property
    def pools(self) -> tuple[Pool, ...]:
        """The pools of the fleet applied last."""
        return self._pools

    def pool_urls(self, pool: str) -> tuple[str, ...]:
        """The endpoint URLs of ``pool`` now (a ``resolve: dns`` pool's: its addresses)."""
        return self._pool_urls[pool]

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
            self._endpoint_snapshot(self._endpoints[u], now) for u in self._pool_urls[pool.name]
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
            ) if pool.hardware is not None and pool.model is not None else 0.0,  # 0 = unknown
            chunk_tokens=pool.levers.chunked_prefill.token_budget
            if pool.levers.chunked_prefill and pool.levers.chunked_prefill.enabled
            else None,
            draft_tokens=pool.levers.speculative.num_draft_tokens
            if pool.levers.speculative else 0,
            adapters=frozenset(pool.adapter_names()),
        )

    def _endpoint_snapshot(self, ep: _Endpoint, now: float) -> EndpointSnapshot:
        return EndpointSnapshot(ep.url, ep.pool, ep.healthy, self._shown_metrics(ep, now),
                                ep.lever_check.missing, ep.adapters.names())

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

    def pool_of(self, url: str) -> str | None:
        """The pool of the endpoint ``url`` (None: not in the registry)."""
        ep = self._endpoints.get(url)
        return ep.pool if ep is not None else None

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
            lever_check=ep.lever_check,
        )

    def models_available(self) -> list[str]:
        """Sorted union of the models and LoRA adapters of every pool with at least one healthy
        endpoint."""
        return sorted(self.model_parents())

    def model_parents(self) -> dict[str, str | None]:
        """Every model of :meth:`models_available` → its parent: None for a base model, the
        base model for a LoRA adapter (its pool's first model when declared, as the engine
        reports it when learned from an engine's list); sorted by name."""
        found: dict[str, str | None] = {}
        for pool in self._pools:
            healthy = [ep for u in self._pool_urls[pool.name]
                       if (ep := self._endpoints[u]).healthy]
            if not healthy:
                continue
            learned = {name: parent for ep in healthy for name, parent in ep.adapters.parents}
            declared = dict.fromkeys(pool.adapter_names(), pool.models[0])
            for name, parent in {**learned, **declared}.items():
                found.setdefault(name, parent)
            found.update(dict.fromkeys(pool.models))
        return dict(sorted(found.items()))

    # -- health ---------------------------------------------------------------------------------

    def mark_failed(self, url: str, reason: str) -> None:
        """Passive health: a proxied request to ``url`` failed; unhealthy until re-polled, and
        one more failure for its circuit breaker (which may open or reopen it). Ignored for an
        endpoint no longer in a pool (its request outlived it there)."""
        ep = self._endpoints.get(url)
        if ep is None or ep.left_at is not None:
            return
        now = self._clock()
        self._set_health(ep, False, reason)
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
        count is 0 (then the breaker is closed), and never a snapshot rebuild. Ignored for an
        endpoint no longer in a pool."""
        ep = self._endpoints.get(url)
        if ep is None or ep.request_failures == 0 or ep.left_at is not None:
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
                    _redacted(ep.url), ep.pool, ep.open_s, ep.request_failures,
                    _redacted(reason))

    def _close(self, ep: _Endpoint) -> None:
        ep.request_failures, ep.open_until, ep.open_s = 0, None, None
        log.info("endpoint %s (pool %s): circuit breaker closed, a request succeeded",
                 _redacted(ep.url), ep.pool)

    def record_poll(self, url: str, result: PollResult) -> None:
        """Apply one poll's findings (the rules are in the module docstring); ignored for an
        endpoint that left its pool while it was probed."""
        ep = self._endpoints.get(url)
        if ep is None or ep.left_at is not None:
            return
        ep.last_poll_at = self._clock()
        if result.metrics is not None:
            ep.metrics = result.metrics
            ep.metrics_at = ep.last_poll_at
        if not result.healthy:
            self._set_health(ep, False, result.error)
            ep.consecutive_failures += 1
            ep.last_error = result.error
        elif result.started_at >= ep.failed_at:
            self._set_health(ep, True, None)
            ep.consecutive_failures = 0
            ep.last_error = result.error
        self._changed()

    def _set_health(self, ep: _Endpoint, healthy: bool, reason: str | None) -> None:
        """Set ``ep``'s health; its first verdict and every change are logged (one line) and
        may change its pool's."""
        was_known, changed = ep.known, not ep.known or ep.healthy != healthy
        ep.known, ep.healthy = True, healthy
        if not changed:
            return
        now = self._clock()
        if healthy and was_known:
            log.info("endpoint %s (pool %s) is back up after %.1f s down",
                     _redacted(ep.url), ep.pool, now - ep.down_at)
        elif healthy:
            log.info("endpoint %s (pool %s) is up", _redacted(ep.url), ep.pool)
        else:
            ep.down_at, ep.facts_due = now, True
            log.warning("endpoint %s (pool %s) is down: %s", _redacted(ep.url), ep.pool,
                        _redacted(reason or "no reason given"))
        self._pool_health(ep.pool, ep.url, reason)

    def _pool_health(self, pool: str, url: str, reason: str | None) -> None:
        """Log ``pool`` losing its last healthy endpoint or getting one back (``url``: the
        endpoint whose change did it)."""
        before, after = self._pool_up[pool], self._pool_state(pool)
        if after is None or after == before:
            return
        self._pool_up[pool] = after
        if after and before is False:
            log.info("pool %s has a healthy endpoint again (%s)", pool, _redacted(url))
        elif not after and before:
            log.warning("pool %s lost its last healthy endpoint (%s: %s)", pool,
                        _redacted(url), _redacted(reason or "no reason given"))
        elif not after:
            log.warning("pool %s has no healthy endpoint", pool)

    def _pool_state(self, pool: str) -> bool | None:
        """True: a healthy endpoint; False: none, every one judged; None: not yet known."""
        endpoints = [self._endpoints[u] for u in self._pool_urls[pool]]
        if any(e.healthy for e in endpoints):
            return True
        return False if all(e.known for e in endpoints) else None

    # -- endpoints that change ---------------------------------------------------------------

    def watch(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change of the endpoint set (joined, left, gone)."""
        self._listeners.append(listener)

    def set_endpoints(self, pool: str, urls: Sequence[str]) -> FleetChanges:
        """``pool``'s endpoints become ``urls`` (a look-up's result, in order): the new ones
        join, the missing ones drain (module docstring). Nothing for a pool not in the fleet."""
        found = next((p for p in self._pools if p.name == pool), None)
        if found is None:
            return FleetChanges()
        wanted = self._claimable(pool, urls)
        if wanted == self._pool_urls[pool]:
            return FleetChanges()  # the usual case: the cached snapshot stays true
        drained = self._shrink(pool, wanted)
        return self._finish(FleetChanges(added=self._grow(found, wanted), drained=drained))

    def apply_fleet(self, fleet: Fleet,
                    resolved: Mapping[str, Sequence[str]] | None = None) -> FleetChanges:
        """Make ``fleet`` the registry's (a reload): removed pools' endpoints drain, new pools
        come in empty, changed ones (``pools_changed``: other than in their endpoints) take their
        new configuration, every pool's endpoints become the file's — for a ``resolve: dns`` pool,
        ``resolved[name]`` when given, else the addresses it has if its names did not change,
        else none until the next look-up. A kept endpoint of a pool whose engine or levers
        changed has its engine's facts read and checked again."""
        old = {p.name: p for p in self._pools}
        new = {p.name: p for p in fleet.pools}
        wanted = {p.name: self._wanted(p, old.get(p.name), resolved or {}) for p in fleet.pools}
        drained: list[str] = []
        for name in old:  # every leaving endpoint first, so that one may move to another pool
            drained += self._shrink(name, wanted.get(name, ()), log_pool=name in new)
        for name in old.keys() - new.keys():
            del self._pool_urls[name], self._pool_up[name], self._declared[name]
        changed = tuple(p.name for p in fleet.pools
                        if p.name in old and _reconfigured(old[p.name], p))
        for name in changed:
            self._refresh(new[name], old[name])
        self._pools = tuple(fleet.pools)
        added: list[str] = []
        for pool in fleet.pools:
            self._declared[pool.name] = declared_facts(pool)
            self._pool_urls.setdefault(pool.name, ())
            self._pool_up.setdefault(pool.name, None)
            added += self._grow(pool, self._claimable(pool.name, wanted[pool.name]))
        return self._finish(FleetChanges(
            tuple(n for n in new if n not in old), tuple(n for n in old if n not in new),
            changed, tuple(added), tuple(drained)))

    def _wanted(self, pool: Pool, before: Pool | None,
                resolved: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
        """The endpoints ``pool`` should have once applied (see :meth:`apply_fleet`)."""
        if pool.resolve != DNS:
            return tuple(pool.endpoint_urls())
        if pool.name in resolved:
            return tuple(resolved[pool.name])
        same = before is not None and before.resolve == DNS and \
            before.endpoint_urls() == pool.endpoint_urls()
        return self._pool_urls[pool.name] if same else ()

    def _claimable(self, pool: str, urls: Iterable[str]) -> tuple[str, ...]:
        """``urls`` without a trailing slash or repeats, and without those another pool holds
        (a WARNING, once per URL and pool)."""
        out = []
        for url in dict.fromkeys(u.rstrip("/") for u in urls):
            ep = self._endpoints.get(url)
            if ep is not None and ep.left_at is None and ep.pool != pool:
                if (pool, url) not in self._refused:
                    self._refused.add((pool, url))
                    log.warning("endpoint %s is in pool %s: pool %s does not take it too",
                                _redacted(url), ep.pool, pool)
                continue
            out.append(url)
        return tuple(out)

    def _shrink(self, pool: str, wanted: Iterable[str], log_pool: bool = True
                ) -> tuple[str, ...]:
        """The endpoints of ``pool`` not in ``wanted`` leave it and drain."""
        keep = set(wanted)
        before = self._pool_urls[pool]
        gone = tuple(u for u in before if u not in keep)
        if not gone:
            return ()
        self._pool_urls[pool] = tuple(u for u in before if u in keep)
        now = self._clock()
        for url in gone:
            ep = self._endpoints[url]
            ep.left_at = now
            log.info("endpoint %s left pool %s: draining (nothing new is sent there; the "
                     "requests in flight finish)", _redacted(url), pool)
        if log_pool:
            self._pool_health(pool, gone[-1], "it left the pool")
        return gone

    def _grow(self, pool: Pool, wanted: tuple[str, ...]) -> tuple[str, ...]:
        """``pool``'s endpoints become ``wanted`` (a superset of them): the new ones join,
        unhealthy until probed; one that was draining starts afresh."""
        have = set(self._pool_urls[pool.name])
        added = tuple(u for u in wanted if u not in have)
        for url in added:
            again = url in self._endpoints
            self._endpoints[url] = _Endpoint(url, pool.name, dialect_for(pool.engine))
            log.info("endpoint %s joins pool %s%s", _redacted(url), pool.name,
                     " again (it was draining)" if again else "")
        self._pool_urls[pool.name] = wanted
        return added

    def _refresh(self, pool: Pool, before: Pool) -> None:
        """A changed pool's kept endpoints: their engine's facts read and checked again when
        what the pool declares changed."""
        if pool.engine == before.engine and declared_facts(pool) == declared_facts(before):
            return
        for url in self._pool_urls[pool.name]:
            ep = self._endpoints[url]
            ep.dialect, ep.lever_check, ep.facts_due = dialect_for(pool.engine), LeverCheck(), True

    def _finish(self, changes: FleetChanges) -> FleetChanges:
        self._changed()
        if changes:
            for listener in self._listeners:
                listener()
        return changes

    def sweep(self, in_flight: InFlight | None = None) -> tuple[str, ...]:
        """The draining endpoints with none of ``in_flight`` (the router state's reservations;
        None: nothing in flight) on them, or draining for ``drain_timeout_s``, leave the
        registry; their URLs."""
        now, in_flight = self._clock(), in_flight or {}
        gone = []
        for ep in list(self._endpoints.values()):
            if ep.left_at is None:
                continue
            busy, drained_s = in_flight.get(ep.url, NO_LOAD).requests, now - ep.left_at
            if busy and drained_s < self._drain_timeout_s:
                continue
            del self._endpoints[ep.url]
            gone.append(ep.url)
            if busy:
                log.warning("endpoint %s (pool %s) is gone after draining %.0f s, with %d "
                            "request(s) still in flight there (they go on)", _redacted(ep.url),
                            ep.pool, drained_s, busy)
            else:
                log.info("endpoint %s (pool %s) is gone: drained", _redacted(ep.url), ep.pool)
        if not gone:
            return ()
        self._changed()
        for listener in self._listeners:
            listener()
        return tuple(gone)

    # -- what the engines run -------------------------------------------------------------------

    def facts_due(self, url: str) -> bool:
        """Whether to read ``url``'s engine facts now: it is healthy, and they were not read
        since it last became healthy or for ``facts_every_s`` (False for an endpoint no longer
        in a pool)."""
        ep = self._endpoints.get(url)
        if ep is None or ep.left_at is not None or not ep.healthy:
            return False
        every = self._facts_every_s
        return ep.facts_due or (every is not None and self._clock() - ep.facts_at >= every)

    def record_facts(self, url: str, facts: Facts, started_at: float) -> None:
        """Check what ``url``'s engine says it runs (read from ``started_at``, on the registry's
        clock) against its pool's levers; dropped if the endpoint went down or left meanwhile."""
        ep = self._endpoints.get(url)
        if ep is None or ep.left_at is not None or not ep.healthy or started_at < ep.down_at:
            return
        check = check_levers(self._declared[ep.pool], facts)
        self._log_levers(ep, check)
        adapters = _adapters(facts, ep.adapters)
        if check.missing != ep.lever_check.missing or adapters != ep.adapters:
            self._changed()
        ep.lever_check, ep.facts_due, ep.facts_at = check, False, started_at
        ep.adapters = adapters

    def _log_levers(self, ep: _Endpoint, check: LeverCheck) -> None:
        """A mismatch once per (endpoint, lever) while it lasts, and its end."""
        before = ep.lever_check
        for m in check.mismatches:
            if not before.mismatched(m.lever):
                consequence = ("; the router no longer counts on it there"
                               if m.lever in check.missing else "")
                log.warning("endpoint %s (pool %s): lever %s %s%s", _redacted(ep.url),
                            ep.pool, m.lever, m.describe(), consequence)
        for m in before.mismatches:
            if m.lever in check.checked and not check.mismatched(m.lever):
                log.info("endpoint %s (pool %s): lever %s is now as declared",
                         _redacted(ep.url), ep.pool, m.lever)


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
            log.warning("reading the engine facts of %s raised %s", _redacted(url),
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


def _adapters(facts: Facts, before: LoadedAdapters) -> LoadedAdapters:
    """The adapters ``facts`` list; none when the model list was read without any (its
    ``max_context`` is known), ``before`` when it was not read at all."""
    found = facts.get(ADAPTERS)
    if isinstance(found, LoadedAdapters):
        return found
    return LoadedAdapters() if MAX_CONTEXT in facts else before


def _reconfigured(before: Pool, after: Pool) -> bool:
    """Whether a pool changed other than in its endpoints."""
    return before.model_copy(update={"endpoints": after.endpoints}) != after


def _written(pool: Pool) -> tuple[str, ...]:
    """A pool's endpoints as the fleet file writes them; none for a ``resolve: dns`` pool
    (its addresses come with the first look-up)."""
    return () if pool.resolve == DNS else tuple(pool.endpoint_urls())


_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


def _redacted(text: str) -> str:
    """``text`` without the credentials (``user:password@``) of any URL in it."""
    return _USERINFO.sub("", text)


def _reason(what: str, exc: Exception) -> str:
    if isinstance(exc, ProbeError):
        return f"{what}: {exc.reason}"
    log.warning("%s probe raised %s", what, type(exc).__name__, exc_info=exc)
    return f"{what}: {type(exc).__name__}: {exc}"
