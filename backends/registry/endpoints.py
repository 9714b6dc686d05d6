"""The endpoint registry: live state of every engine endpoint.

:class:`EndpointRegistry` is built from a :class:`config.fleet.Fleet` and holds one
:class:`~backends.registry.record.EndpointRecord` per endpoint: health, the last
:class:`EngineMetrics` and error, consecutive failures, the last poll. The
:class:`~backends.registry.poller.Poller` refreshes it; the router reads it through
:meth:`EndpointRegistry.snapshot` (frozen snapshots, rebuilt only after a poll or a failure
changed something). In-flight requests are not counted here: the router state's reservations
are the one count (:mod:`routing.load`).

Invariants: an endpoint starts unhealthy until a probe passes; a request failure outlasts any
probe started before it; an open circuit breaker (:mod:`backends.registry.breaker`) keeps an
endpoint out whatever the probes say; an endpoint that leaves drains (in no snapshot, its
requests in flight finish) and is gone once idle or after ``drain_timeout_s`` [s]. One asyncio
event loop; not thread-safe. See docs/backends.md#the-endpoint-registry.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from backends.engines.dialects import EngineDialect, dialect_for
from backends.engines.facts import ADAPTERS, MAX_CONTEXT, Facts, LoadedAdapters
from backends.registry.breaker import BreakerConfig, close_breaker, open_breaker, trips
from backends.registry.changes import FleetChanges, reconfigured, wanted_urls, written
from backends.registry.lever_check import LeverCheck, check_levers, declared_facts
from backends.registry.operator_log import LOGGER, redacted
from backends.registry.record import EndpointRecord
from backends.registry.status import EndpointStatus, PollResult, status_of
from config.fleet import Fleet
from config.pools import Pool, pool_levers
from routing.formulas import decode_ridge_tokens
from routing.load import NO_LOAD, InFlight
from routing.snapshots import EndpointSnapshot, EngineMetrics, PoolSnapshot

log = logging.getLogger(LOGGER)


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
        breaker: BreakerConfig = BreakerConfig(),  # noqa: B008 - frozen, so one default is safe
        drain_timeout_s: float = 300.0,
        facts_every_s: float | None = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must not be negative")
        self._pools: tuple[Pool, ...] = tuple(fleet.pools)
        self._pool_urls = {pool.name: written(pool) for pool in fleet.pools}
        self._endpoints: dict[str, EndpointRecord] = {
            url: EndpointRecord(url, pool.name, dialect_for(pool.engine))
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

    def _get(self, url: str) -> EndpointRecord:
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

    def _endpoint_snapshot(self, ep: EndpointRecord, now: float) -> EndpointSnapshot:
        return EndpointSnapshot(ep.url, ep.pool, ep.healthy, self._shown_metrics(ep, now),
                                ep.lever_check.missing, ep.adapters.names())

    def _shown_metrics(self, ep: EndpointRecord, now: float) -> EngineMetrics:
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
        return status_of(self._get(url), self._clock())

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
        if trips(self._breaker, ep, now):
            open_breaker(self._breaker, ep, now, reason)
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
            close_breaker(ep)

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

    def _set_health(self, ep: EndpointRecord, healthy: bool, reason: str | None) -> None:
        """Set ``ep``'s health; its first verdict and every change are logged (one line) and
        may change its pool's."""
        was_known, changed = ep.known, not ep.known or ep.healthy != healthy
        ep.known, ep.healthy = True, healthy
        if not changed:
            return
        now = self._clock()
        if healthy and was_known:
            log.info("endpoint %s (pool %s) is back up after %.1f s down",
                     redacted(ep.url), ep.pool, now - ep.down_at)
        elif healthy:
            log.info("endpoint %s (pool %s) is up", redacted(ep.url), ep.pool)
        else:
            ep.down_at, ep.facts_due = now, True
            log.warning("endpoint %s (pool %s) is down: %s", redacted(ep.url), ep.pool,
                        redacted(reason or "no reason given"))
        self._pool_health(ep.pool, ep.url, reason)

    def _pool_health(self, pool: str, url: str, reason: str | None) -> None:
        """Log ``pool`` losing its last healthy endpoint or getting one back (``url``: the
        endpoint whose change did it)."""
        before, after = self._pool_up[pool], self._pool_state(pool)
        if after is None or after == before:
            return
        self._pool_up[pool] = after
        if after and before is False:
            log.info("pool %s has a healthy endpoint again (%s)", pool, redacted(url))
        elif not after and before:
            log.warning("pool %s lost its last healthy endpoint (%s: %s)", pool,
                        redacted(url), redacted(reason or "no reason given"))
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
        wanted = {p.name: wanted_urls(p, old.get(p.name), resolved or {}, self._pool_urls)
                  for p in fleet.pools}
        drained: list[str] = []
        for name in old:  # every leaving endpoint first, so that one may move to another pool
            drained += self._shrink(name, wanted.get(name, ()), log_pool=name in new)
        for name in old.keys() - new.keys():
            del self._pool_urls[name], self._pool_up[name], self._declared[name]
        changed = tuple(p.name for p in fleet.pools
                        if p.name in old and reconfigured(old[p.name], p))
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
                                redacted(url), ep.pool, pool)
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
                     "requests in flight finish)", redacted(url), pool)
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
            self._endpoints[url] = EndpointRecord(url, pool.name, dialect_for(pool.engine))
            log.info("endpoint %s joins pool %s%s", redacted(url), pool.name,
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
                            "request(s) still in flight there (they go on)", redacted(ep.url),
                            ep.pool, drained_s, busy)
            else:
                log.info("endpoint %s (pool %s) is gone: drained", redacted(ep.url), ep.pool)
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

    def _log_levers(self, ep: EndpointRecord, check: LeverCheck) -> None:
        """A mismatch once per (endpoint, lever) while it lasts, and its end."""
        before = ep.lever_check
        for m in check.mismatches:
            if not before.mismatched(m.lever):
                consequence = ("; the router no longer counts on it there"
                               if m.lever in check.missing else "")
                log.warning("endpoint %s (pool %s): lever %s %s%s", redacted(ep.url),
                            ep.pool, m.lever, m.describe(), consequence)
        for m in before.mismatches:
            if m.lever in check.checked and not check.mismatched(m.lever):
                log.info("endpoint %s (pool %s): lever %s is now as declared",
                         redacted(ep.url), ep.pool, m.lever)



def _adapters(facts: Facts, before: LoadedAdapters) -> LoadedAdapters:
    """The adapters ``facts`` list; none when the model list was read without any (its
    ``max_context`` is known), ``before`` when it was not read at all."""
    found = facts.get(ADAPTERS)
    if isinstance(found, LoadedAdapters):
        return found
    return LoadedAdapters() if MAX_CONTEXT in facts else before

