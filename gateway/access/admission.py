"""Admission control: a request that would wait past its TTFT SLO is refused at once (503 with
``Retry-After``) instead of being accepted and missing it; one that can wait does, at the
gateway, fair across keys, rather than in an engine's queue.

:meth:`Admission.place` (the dispatcher's ``place``) lets the router state place the request
with the full endpoints left out of the choice (:class:`Gate`), except where a full endpoint
holds ``cache_affinity`` of the prompt (:func:`cache_affine`). When only full endpoints could
take it, it joins its pool's queue (refused at once as ``queue_full`` or ``would_miss_slo``),
and the queue's head retries on every release, first token and ``recheck_s`` until it is
placed or its budget runs out (``wait_expired``).

The arithmetic is :mod:`routing.admission.capacity`, the fairness
:mod:`routing.admission.fair_queue`; parameters are :class:`AdmissionConfig`
(``RIDGE_ADMISSION__*``). One instance per gateway process: queues and estimates are its own.
See docs/gateway.md#admission-control.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from gateway.request.deadline import within
from gateway.server.errors import GatewayError
from gateway.telemetry.prometheus import Telemetry
from gateway.telemetry.slos import SloPolicy
from routing.admission.capacity import (
    NOTHING,
    CapacityConfig,
    CapacityTracker,
    Limits,
    ReleaseRate,
    TtftFloor,
    expected_wait_s,
    full_endpoints,
    likely_wait_s,
    retry_after_s,
    wait_budget_s,
)
from routing.admission.fair_queue import FairQueue
from routing.admission.prefill_pace import (
    PeerPrefill,
    PrefillRate,
    paced_endpoints,
    prefill_cap,
    prefill_wait_s,
)
from routing.features import RequestFeatures
from routing.router import RoutePlan, Router
from routing.snapshots import PoolSnapshot
from routing.state.protocol import Ask, Placed, RouterState, StateView

QUEUE_FULL = "queue_full"
WOULD_MISS_SLO = "would_miss_slo"
WAIT_EXPIRED = "wait_expired"
REASONS = (QUEUE_FULL, WOULD_MISS_SLO, WAIT_EXPIRED)
"""Why a request was refused (the ``reason`` label of ``ridge_admission_rejected_total``)."""

Snapshot = Callable[[], tuple[PoolSnapshot, ...]]


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """``max_wait_s`` [s]: the wait budget of a model without a TTFT SLO, and the most any
    request waits; ``max_queue`` [requests]: per pool, past it refused at once; ``recheck_s``
    [s]: how often the head of a queue looks for room released by other gateways;
    ``capacity``: how endpoint capacity is learned
    (:class:`routing.admission.capacity.CapacityConfig`);
    ``prefill_target`` [fraction of the TTFT SLO]: prefill pacing's
    (:mod:`routing.admission.prefill_pace`;
    0: off); ``wait_deviations``: a request joins a queue when the expected wait plus this many
    standard deviations is within its budget (:func:`routing.admission.capacity.likely_wait_s`);
    ``cache_affinity`` [fraction of the prompt's tokens]: a request the prefix index says a
    full or paced endpoint holds this much of goes there anyway, to wait in its engine's queue
    (:func:`cache_affine`; 0: never)."""

    max_wait_s: float = 10.0
    max_queue: int = 256
    recheck_s: float = 0.025
    capacity: CapacityConfig = CapacityConfig()
    prefill_target: float = 0.5
    wait_deviations: float = 2.0
    cache_affinity: float = 0.5


class Route:
    """What the router needs for one placement: the request's features, the pools, the
    endpoints it may not go to (already tried); and who sent it (``key``: fairness) and its
    SLO class (``slo_class``: its TTFT SLO). A plain class, never changed once made: compiled,
    made with no call into the interpreter (one per request)."""

    __slots__ = ("router", "features", "pools", "exclude", "key", "slo_class")

    def __init__(self, router: Router, features: RequestFeatures,
                 pools: tuple[PoolSnapshot, ...], exclude: frozenset[str],
                 key: str | None = None, slo_class: str | None = None) -> None:
        self.router, self.features, self.pools, self.exclude = router, features, pools, exclude
        self.key, self.slo_class = key, slo_class


class Gate:
    """One placement's ``choose``: the router's, with the full endpoints, the ``paced`` ones and
    the ``blocked`` ones left out — except that a request holding at least ``affinity`` of its
    prompt in the cache of a full or paced endpoint (the prefix index's match) goes where the
    router would send it with nothing left out, when that is such an endpoint
    (:func:`cache_affine`). ``held``: after a call that chose nothing, the pool the router would
    have chosen without them (None: it would have chosen nothing anyway). ``paced`` is asked at
    each call, not at construction: a state that reads over the network chooses after an
    await, when other requests may have been placed; ``hold`` is told each call's choice.
    ``paced_only``: after a call that chose nothing, whether pacing alone kept the request from
    the pool the router would have chosen (none of its endpoints at capacity)."""

    __slots__ = ("_route", "_pools", "_limits", "_check", "_blocked", "_paced", "_affinity",
                 "_hold", "held", "paced_only")

    def __init__(self, route: Route, pools: tuple[PoolSnapshot, ...], limits: Limits,
                 blocked: frozenset[str],
                 paced: Callable[[StateView], frozenset[str]] | None = None,
                 affinity: float = 0.0,
                 hold: Callable[[RoutePlan | None], None] | None = None) -> None:
        self._route, self._pools, self._limits = route, pools, limits
        self._check = bool(limits)
        self._blocked, self._paced, self._affinity = blocked, paced, affinity
        self._hold = hold
        self.held: str | None = None
        self.paced_only = False

    def __call__(self, view: StateView) -> RoutePlan | None:
        if self._hold is None:
            return self._choose(view)
        self._hold(None)  # a second call (the state chose again): its last choice is void
        plan = self._choose(view)
        self._hold(plan)
        return plan

    def _choose(self, view: StateView) -> RoutePlan | None:
        route = self._route
        self.held, self.paced_only = None, False
        load = view.load
        at_capacity = full_endpoints(load, self._limits) if self._check and load else NOTHING
        paced = self._paced(view) if self._paced is not None else NOTHING
        full = at_capacity | paced if paced else at_capacity
        choose = route.router.choose
        if not full and not self._blocked:
            return choose(route.features, self._pools, view, route.exclude)
        plan = choose(route.features, self._pools, view, route.exclude | full | self._blocked)
        if plan is None:
            intended = choose(route.features, self._pools, view, route.exclude)
            self.held = intended.decision.pool if intended is not None else None
            self.paced_only = intended is not None and not at_capacity.intersection(
                intended.urls)
        elif full and self._affinity and cache_affine(route.features, view, full, plan,
                                                      self._affinity):
            intended = choose(route.features, self._pools, view, route.exclude | self._blocked)
            if intended is not None and intended.first.url in full:
                return intended  # its cache is there: wait in that engine's queue
        return plan


def cache_affine(features: RequestFeatures, view: StateView, full: frozenset[str],
                 plan: RoutePlan, affinity: float) -> bool:
    """Whether a full or paced endpoint holds at least ``affinity`` of the prompt's tokens
    (the prefix index's match), more than ``plan``'s endpoint does. Recomputing that prefix
    elsewhere costs more prefill than the queue it would join, and writes a second copy into
    another cache, evicting what that cache held.

    Where the match is the engines' own (KV events), an endpoint counts with the larger of
    its exact match and the blocks sent there (``view.sent_blocks``): the session's home keeps
    it even when part of its history was evicted, since moving writes the whole history into
    a second cache (what the exact match alone did to agent follow-ups is in
    ``docs/benchmarks/router.md``)."""
    need = affinity * features.prompt_tokens
    best = max((_held(view, url) for url in full), default=0)
    return best * features.block_tokens >= need and best > _held(view, plan.first.url)


def _held(view: StateView, url: str) -> int:
    """The blocks ``url`` counts as holding for :func:`cache_affine`."""
    matched, sent = view.matched_blocks.get(url, 0), view.sent_blocks
    return matched if sent is None else max(matched, sent.get(url, 0))


def _add(counts: dict[str, int], url: str, n: int) -> None:
    """``counts[url] += n``, the entry dropped at 0 or below."""
    left = counts.get(url, 0) + n
    if left > 0:
        counts[url] = left
    else:
        counts.pop(url, None)


class Tentative:
    """A prompt being placed, counted on the first endpoint of the last plan it was told of:
    its ``tokens`` in ``outstanding`` (URL → prefill tokens) and one request in ``placing``
    (URL → requests); told None, it counts nowhere."""

    __slots__ = ("_outstanding", "_placing", "_tokens", "_url")

    def __init__(self, outstanding: dict[str, int], placing: dict[str, int],
                 tokens: int) -> None:
        self._outstanding, self._placing, self._tokens = outstanding, placing, tokens
        self._url: str | None = None

    def __call__(self, plan: RoutePlan | None) -> None:
        if self._url is not None:
            _add(self._outstanding, self._url, -self._tokens)
            _add(self._placing, self._url, -1)
        self._url = plan.first.url if plan is not None else None
        if self._url is not None:
            _add(self._outstanding, self._url, self._tokens)
            _add(self._placing, self._url, 1)


class Ticket:
    """A request waiting in a pool's queue; woken to try again."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    async def sleep(self, seconds: float) -> None:
        """Until woken, or ``seconds`` passed."""
        if not self._event.is_set() and seconds > 0:
            await within(seconds, self._event.wait())
        self._event.clear()


Placement: TypeAlias = "tuple[Placed[RoutePlan] | None, float]"
"""The state's placement (None: nothing could take the request) and the time it waited [s].
A string: ``Placed``, compiled, cannot be subscripted at run time."""


class Admission:
    """Admission control for one gateway process (module docstring). ``snapshot``: the
    registry's pools now; ``clock``: monotonic seconds; ``prefill_priors``: each pool's prefill
    rate [prompt tokens/s] until one is measured
    (:func:`routing.admission.prefill_pace.roofline_prefill_rate`)."""

    def __init__(self, config: AdmissionConfig, slos: SloPolicy, snapshot: Snapshot,
                 telemetry: Telemetry | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 prefill_priors: Mapping[str, float] | None = None) -> None:
        self._config, self._slos, self._snapshot = config, slos, snapshot
        self._prefill_priors = dict(prefill_priors or {})
        self._telemetry, self._clock = telemetry, clock
        self._capacity = CapacityTracker(config.capacity, clock)
        self._queues: dict[str, FairQueue[Ticket]] = {}
        self._rates: dict[str, ReleaseRate] = {}
        self._floors: dict[str, TtftFloor] = {}
        self._prefill: dict[str, int] = {}
        self._prefill_rates: dict[str, PrefillRate] = {}
        self._waiting = 0
        self._held: dict[str, int] = {}
        """Reservations this gateway placed and has not released, per pool."""
        self._own: dict[str, int] = {}
        """The same per endpoint URL; ``_placing``: requests being placed, per first URL."""
        self._placing: dict[str, int] = {}
        self._peers = PeerPrefill()

    def capacities(self) -> list[tuple[str, str, int]]:
        """(pool, endpoint, requests) for every endpoint whose capacity is known now: the
        requests it holds before admission counts it full (:mod:`routing.admission.capacity`;
        an endpoint known only by its KV size in tokens has none until it serves)."""
        limits = self._capacity.limits(self._snapshot())
        pool_of = self._capacity.pool_of
        return [(pool_of(url) or "", url, at - limits.allowance)
                for url, at in sorted(limits.at.items())]

    def waiting(self, pool: str) -> int:
        """Requests waiting for ``pool``."""
        queue = self._queues.get(pool)
        return len(queue) if queue is not None else 0

    async def place(self, state: RouterState, ask: Ask, route: Route) -> Placement:
        """Place the request through ``state`` if an endpoint has room, else wait for one or
        raise the 503 (module docstring)."""
        placed, held, paced_only = await self._try_place(state, ask, route, route.pools, None)
        if placed is None and held is not None:
            placed, waited = await self._wait(held, state, ask, route, paced_only)
        else:
            waited = 0.0
        if placed is not None:
            self._holding(placed)
        return placed, waited

    async def _try_place(self, state: RouterState, ask: Ask, route: Route,
                         pools: tuple[PoolSnapshot, ...],
                         own: str | None) -> tuple[Placed[RoutePlan] | None, str | None, bool]:
        """One placement through a gate (``own``: the pool whose queue the request waits in);
        the placement, the pool the router would have chosen when it placed nothing, and
        whether only prefill pacing held it from there."""
        hold = self._tentative(route)
        gate = self._gate(route, pools, own, hold)
        try:
            return await state.place(ask, gate), gate.held, gate.paced_only
        finally:
            if hold is not None:
                hold(None)

    def _tentative(self, route: Route) -> Tentative | None:
        """What counts the prompt of a request being placed as outstanding prefill on the
        endpoint its gate chose, until the placement ends (the dispatcher then counts it for
        good, :meth:`prefill_started`, without a turn of the event loop between)."""
        tokens = route.features.prompt_tokens
        if not self._config.prefill_target or tokens <= 0:
            return None
        return Tentative(self._prefill, self._placing, tokens)

    def _holding(self, placed: Placed[RoutePlan]) -> None:
        """Count ``placed``'s reservations in flight on their pools; a pool that held none
        until now was idle, and idle time is no gap between releases
        (:meth:`routing.admission.capacity.ReleaseRate.resume`)."""
        for reservation in placed.reservations:
            _add(self._own, reservation.endpoint, 1)
            pool = self._capacity.pool_of(reservation.endpoint)
            if pool is None:
                continue
            held = self._held.get(pool, 0)
            if held == 0:
                self._rate(pool).resume(self._clock())
            self._held[pool] = held + 1

    def released(self, url: str) -> None:
        """A reservation on ``url`` was released: count it, and wake the heads of the queues."""
        _add(self._own, url, -1)
        pool = self._capacity.pool_of(url)
        if pool is None:
            return
        self._rate(pool).release(self._clock())
        self._held[pool] = max(0, self._held.get(pool, 0) - 1)
        self._wake_heads()

    def _wake_heads(self) -> None:
        if self._waiting:
            for queue in self._queues.values():
                if (head := queue.head()) is not None:
                    head.wake()

    def prefill_started(self, url: str, tokens: int) -> int:
        """A streamed request of ``tokens`` prompt tokens was sent to ``url``: its prefill is
        outstanding until :meth:`prefill_done`. Returns the outstanding prefill on ``url`` with
        it [tokens] (0: not counted, pacing off)."""
        if not self._config.prefill_target or tokens <= 0:
            return 0
        ahead = self._prefill.get(url, 0) + tokens
        self._prefill[url] = ahead
        return ahead

    def prefill_done(self, url: str, tokens: int, ahead: int,
                     engine_ttft_s: float | None) -> None:
        """The request :meth:`prefill_started` counted (``ahead`` its return) had its first
        token ``engine_ttft_s`` after it was sent, or ended without one (None)."""
        if not ahead:
            return
        _add(self._prefill, url, -tokens)
        pool = self._capacity.pool_of(url)
        if engine_ttft_s is not None and pool is not None:
            rate = self._prefill_rates.get(pool)
            if rate is None:
                rate = self._prefill_rates[pool] = PrefillRate()
            rate.observe(ahead, engine_ttft_s)
        self._wake_heads()

    def _rate(self, pool: str) -> ReleaseRate:
        rate = self._rates.get(pool)
        if rate is None:
            rate = self._rates[pool] = ReleaseRate()
        return rate

    def observed_ttft(self, pool: str, engine_ttft_s: float) -> None:
        """A request of ``pool`` got its first token ``engine_ttft_s`` after it was admitted."""
        floor = self._floors.get(pool)
        if floor is None:
            floor = self._floors[pool] = TtftFloor()
        floor.observe(max(0.0, engine_ttft_s))

    def budget_s(self, pool: str, features: RequestFeatures, slo_class: str | None) -> float:
        """How long this request may wait for a slot in ``pool`` [s]."""
        _, bounds = self._slos.bounds_for(features.model, features.max_tokens, slo_class)
        floor = self._floors.get(pool)
        return wait_budget_s(bounds.ttft_s, floor.floor_s() if floor else 0.0,
                             self._config.max_wait_s)

    def _gate(self, route: Route, pools: tuple[PoolSnapshot, ...], own: str | None,
              hold: Tentative | None = None) -> Gate:
        limits = self._capacity.limits(pools)
        blocked = self._blocked(pools, own) if self._waiting else NOTHING

        def paced(view: StateView) -> frozenset[str]:
            return self._paced(route, view)

        return Gate(route, pools, limits, blocked, paced if self._config.prefill_target else None,
                    self._config.cache_affinity, hold)

    def _paced(self, route: Route, view: StateView) -> frozenset[str]:
        """The endpoints prefill pacing keeps this request from
        (:mod:`routing.admission.prefill_pace`), with what ``view`` says other gateways
        placed."""
        features = route.features
        _, bounds = self._slos.bounds_for(features.model, features.max_tokens, route.slo_class)
        ttft = bounds.ttft_s
        if ttft is None:
            return NOTHING
        now = self._clock()
        self._observe_peers(view, features.prompt_tokens, now)
        outstanding = self._outstanding(now)
        if not outstanding:
            return NOTHING
        target, pool_of = self._config.prefill_target, self._capacity.pool_of

        def cap_of(url: str) -> float | None:
            per_s = self.prefill_rate(pool_of(url) or "")
            return prefill_cap(per_s, ttft, target) if per_s is not None else None

        return paced_endpoints(outstanding, features.prompt_tokens, cap_of)

    def _observe_peers(self, view: StateView, tokens: int, now: float) -> None:
        """Tell :class:`PeerPrefill` the requests of other gateways on each endpoint: the
        shared in-flight count, less this gateway's placed and being placed."""
        own, placing, peers, pool_of = self._own, self._placing, self._peers, \
            self._capacity.pool_of
        load = view.load
        for url, counts in load.items():
            others = counts.requests - own.get(url, 0) - placing.get(url, 0)
            if others > 0:
                peers.observe(url, others, tokens, self.prefill_rate(pool_of(url) or ""), now)
        for url in peers.urls:
            if url not in load or load[url].requests <= own.get(url, 0) + placing.get(url, 0):
                peers.observe(url, 0, tokens, None, now)

    def _outstanding(self, now: float) -> dict[str, int]:
        """Each endpoint's outstanding prefill: this gateway's, and its peers' estimate."""
        urls = self._peers.urls
        if not urls:
            return self._prefill
        merged = dict(self._prefill)
        for url in urls:
            if tokens := self._peers.outstanding(url, now):
                merged[url] = merged.get(url, 0) + tokens
        return merged

    def _blocked(self, pools: tuple[PoolSnapshot, ...], own: str | None) -> frozenset[str]:
        """The endpoints of the pools where requests wait, but ``own``'s."""
        return frozenset(ep.url for p in pools if p.name != own and self.waiting(p.name)
                         for ep in p.endpoints)

    async def _wait(self, pool: str, state: RouterState, ask: Ask, route: Route,
                    paced_only: bool = False) -> Placement:
        queue = self._queues.get(pool)
        if queue is None:
            queue = self._queues[pool] = FairQueue()
        joined = self._clock()
        budget = self.budget_s(pool, route.features, route.slo_class)
        self._check_join(pool, queue, route, budget, joined, paced_only)
        ticket = Ticket()
        queue.join(route.key, ticket)
        self._depth(pool, queue, +1)
        served = False
        try:
            placed = await self._turns(pool, queue, ticket, state, ask, route, joined, budget)
            served = placed is not None
            if served:
                queue.served(route.key, ticket)
        finally:
            was_head = not served and queue.head() is ticket
            if not served:
                queue.remove(route.key, ticket)
            self._depth(pool, queue, -1, wake=served or was_head)
        waited = self._clock() - joined
        if served and self._telemetry is not None:
            self._telemetry.admission_waited(pool, waited)
        return placed, waited

    async def _turns(self, pool: str, queue: FairQueue[Ticket], ticket: Ticket,
                     state: RouterState, ask: Ask, route: Route, joined: float,
                     budget: float) -> Placed[RoutePlan] | None:
        """Wait for the ticket's turns and try at each; raises the 503 once ``budget`` seconds
        have passed since ``joined``."""
        deadline = joined + budget
        while True:
            left = deadline - self._clock()
            if left <= 0:
                raise self._refusal(pool, WAIT_EXPIRED, self._expected(pool, len(queue) - 1),
                                    budget)
            head = queue.head() is ticket
            await ticket.sleep(min(left, self._config.recheck_s) if head else left)
            if queue.head() is not ticket:
                continue
            placed, held, _ = await self._try_place(state, ask, route, self._snapshot(), pool)
            if placed is not None or held is None:
                return placed

    def _check_join(self, pool: str, queue: FairQueue[Ticket], route: Route,
                    budget: float, now: float, paced_only: bool = False) -> None:
        """Raise the 503 when the request may not join ``pool``'s queue: a wait it will seldom
        exceed (:func:`routing.admission.capacity.likely_wait_s`), or for prefill room
        (:func:`routing.admission.prefill_pace.prefill_wait_s`) when that is longer, is past its
        budget. Held by pacing alone before any slot of the pool was freed, the wait is for
        prefill room, and its own prefill at the pool's rate counts in it too (the budget's
        TTFT floor is not known yet)."""
        ahead = max(0, queue.served_before(route.key))
        rate = self._rates.get(pool)
        per_s = rate.per_s(now) if rate else None
        expected = None
        if per_s:
            expected = likely_wait_s(ahead, per_s, self._config.wait_deviations)
            if self._prefill:
                expected = max(expected, self._prefill_expected(pool, route, ahead))
        elif paced_only and (prefill := self.prefill_rate(pool)):
            expected = self._prefill_expected(pool, route, ahead) + \
                route.features.prompt_tokens / prefill
        mean = self._expected(pool, ahead, now)  # what a client would wait, on average
        if len(queue) >= self._config.max_queue:
            raise self._refusal(pool, QUEUE_FULL, expected, budget, mean)
        if budget <= 0 or expected is None or expected > budget:
            raise self._refusal(pool, WOULD_MISS_SLO, expected, budget, mean)

    def prefill_rate(self, pool: str) -> float | None:
        """``pool``'s prefill rate [prompt tokens/s]: as measured, else its roofline prior
        (None: neither known)."""
        rate = self._prefill_rates.get(pool)
        if rate is not None and rate.tokens_per_s is not None:
            return rate.tokens_per_s
        return self._prefill_priors.get(pool)

    def _prefill_expected(self, pool: str, route: Route, ahead: int) -> float:
        """[s] until ``pool`` has prefill room for the request with ``ahead`` before it; 0
        while its prefill rate or the request's TTFT SLO is unknown."""
        per_s = self.prefill_rate(pool)
        features = route.features
        _, bounds = self._slos.bounds_for(features.model, features.max_tokens, route.slo_class)
        if per_s is None or bounds.ttft_s is None:
            return 0.0
        urls = [ep.url for p in route.pools if p.name == pool for ep in p.endpoints]
        cap = prefill_cap(per_s, bounds.ttft_s, self._config.prefill_target)
        pending = self._outstanding(self._clock())
        outstanding = sum(pending.get(url, 0) for url in urls)
        return prefill_wait_s(outstanding, features.prompt_tokens, max(0, ahead),
                              max(1, len(urls)), cap, per_s)

    def _expected(self, pool: str, ahead: int, now: float | None = None) -> float | None:
        rate = self._rates.get(pool)
        per_s = rate.per_s(self._clock() if now is None else now) if rate else None
        return expected_wait_s(max(0, ahead), per_s) if per_s else None

    def _depth(self, pool: str, queue: FairQueue[Ticket], change: int,
               wake: bool = False) -> None:
        """The queue changed by ``change``: count, export; ``wake``: its (new) head tries."""
        self._waiting += change
        if self._telemetry is not None:
            self._telemetry.admission_queue(pool, len(queue))
        if wake and (head := queue.head()) is not None:
            head.wake()

    def _refusal(self, pool: str, reason: str, expected: float | None,
                 budget: float, mean: float | None = None) -> GatewayError:
        """The 503 of a refusal: ``expected`` the wait the message names, ``mean`` (else
        ``expected``) the one ``Retry-After`` is counted from."""
        if self._telemetry is not None:
            self._telemetry.admission_refused(pool, reason)
        after = retry_after_s(expected if mean is None else mean,
                              0.0 if reason == WAIT_EXPIRED else budget)
        return GatewayError(503, refusal_message(pool, reason, expected, budget, after),
                            code="overloaded", pool=pool,
                            headers=((b"retry-after", str(after).encode()),
                                     (b"x-ridge-route", f"pool={pool}; refused={reason}".encode())))


def refusal_message(pool: str, reason: str, expected: float | None, budget: float,
                    retry_after: int) -> str:
    """What a refused client reads: the pool is at capacity, and why waiting would not do (the
    budget is what the request's TTFT SLO leaves, or the gateway's longest wait)."""
    head = f"The pool '{pool}' is at capacity"
    if reason == QUEUE_FULL:
        why = " and its queue is full"
    elif reason == WAIT_EXPIRED:
        why = f": no slot freed within the {budget:.2f} s the request could wait"
    elif budget <= 0:
        why = (" and the request cannot wait for a slot and still meet its time-to-first-token "
               "objective")
    elif expected is None:
        why = ": no slot has been freed in it yet, so there is no telling when one will"
    else:
        why = (f": the request would wait about {expected:.2f} s for a slot, more than the "
               f"{budget:.2f} s it may wait, and miss its time-to-first-token objective")
    return f"{head}{why}. Retry after {retry_after} s."
