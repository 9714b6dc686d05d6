"""The router's memory for one gateway process: :class:`MemoryState`, a :class:`RouterState`.

Parts, each bounded (:class:`StateLimits`): the prefix index
(:class:`routing.prefix_index.PrefixIndex`); the in-flight table (:class:`Reservations`:
reservations in the order made and, per endpoint, the requests and tokens they hold, each
dropped after ``reservation_ttl_s`` seconds as if its gateway had died); session affinity
(:class:`SessionMap`: session key → the endpoint that last served it); the workload windows
(:class:`routing.window.WorkloadWindows`).

Invariants: in-flight counts never go negative (only a held reservation is released, once);
``finish`` learns from successful requests only (a failed one's new blocks are forgotten, and
the windows never count a retried request twice); every method runs without awaiting, so under
asyncio each is atomic and :meth:`MemoryState.place` reads, chooses and reserves in one step.

See docs/routing.md#the-router-state.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from routing.load import NO_LOAD, InFlight, LoadCounts
from routing.prefix_index import KeyLayout, PrefixIndex
from routing.state.protocol import Ask, C, Outcome, Placed, Reservation, StateView
from routing.window import WorkloadMeasures, WorkloadWindows

Clock = Callable[[], float]
REFRESH_S = 1.0
"""[s] Blocks an endpoint holds from a record this recent are not written again: not by a new
request sharing them (the prefix index's ``refresh_s``), and not by a finished request whose
deepest block it holds this fresh (then it holds the whole chain)."""


@dataclass(frozen=True, slots=True)
class StateLimits:
    """Bounds of the router's memory. Sizes are counts; ages and TTLs are seconds.

    ``reservation_ttl_s`` must exceed the longest request the gateway lets run (its upstream
    timeout), or a live request stops being counted.
    """

    max_prefix_entries: int = 500_000
    prefix_max_age_s: float = 600.0
    max_sessions: int = 100_000
    session_max_age_s: float = 1800.0
    reservation_ttl_s: float = 900.0
    max_reservations: int = 100_000
    window_requests: int = 1000
    max_models: int = 64

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"StateLimits.{f.name} must be positive")


@dataclass(frozen=True, slots=True)
class StateSizes:
    """How full each bounded part is (entries)."""

    prefix_entries: int
    sessions: int
    reservations: int
    models: int


class SessionMap:
    """Session key → last endpoint, an LRU of ``max_sessions`` with an age limit."""

    __slots__ = ("_max", "_max_age_s", "_map")

    def __init__(self, max_sessions: int, max_age_s: float) -> None:
        self._max = max_sessions
        self._max_age_s = max_age_s
        self._map: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    def bind(self, session: str, endpoint: str, now: float) -> None:
        self._map[session] = (endpoint, now)
        self._map.move_to_end(session)
        while len(self._map) > self._max:
            self._map.popitem(last=False)
        self._purge(now, budget=2)

    def get(self, session: str, now: float) -> str | None:
        held = self._map.get(session)
        if held is None or now - held[1] > self._max_age_s:
            return None
        return held[0]

    def clear(self) -> None:
        self._map.clear()

    def _purge(self, now: float, budget: int) -> None:
        for _ in range(budget):
            if not self._map:
                return
            oldest = next(iter(self._map))
            if now - self._map[oldest][1] <= self._max_age_s:
                return
            del self._map[oldest]


class _Held:
    """One reservation's endpoint, tokens and expiry [s, monotonic]: never changed once made;
    a plain class, made for every request with no call into the interpreter."""

    __slots__ = ("endpoint", "tokens", "expires_at")

    def __init__(self, endpoint: str, tokens: int, expires_at: float) -> None:
        self.endpoint, self.tokens, self.expires_at = endpoint, tokens, expires_at


class Reservations:
    """Reservations and per-endpoint in-flight counts. One TTL for all, so expiry order is
    reservation order and expiring pops from the front (lazily, on the state's calls); at most
    ``max_reservations`` are held, the oldest dropped beyond."""

    __slots__ = ("_ttl_s", "_max", "_held", "_load", "_ids", "_prefix", "_on_drop")

    def __init__(self, ttl_s: float, max_reservations: int,
                 on_drop: Callable[[str, int], None] | None = None) -> None:
        self._ttl_s = ttl_s
        self._max = max_reservations
        self._on_drop = on_drop
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._load: dict[str, LoadCounts] = {}
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:12]

    def __len__(self) -> int:
        return len(self._held)

    def reserve(self, endpoint: str, tokens: int, now: float, rid: str | None = None,
                recorded_from: int | None = None) -> Reservation:
        """Hold one reservation on ``endpoint`` (id ``rid``, or a new one)."""
        self.expire(now)
        tokens = max(0, tokens)
        rid = rid or f"{self._prefix}-{next(self._ids)}"
        self._held[rid] = _Held(endpoint, tokens, now + self._ttl_s)
        self._add(endpoint, 1, tokens)
        while len(self._held) > self._max:
            self._dropped(next(iter(self._held)))
        return Reservation(rid, endpoint, tokens, recorded_from)

    def release(self, reservation_id: str) -> bool:
        """Release a held reservation; False when it is not held (finished or expired)."""
        if reservation_id not in self._held:
            return False
        self._drop(reservation_id)
        return True

    def expire(self, now: float) -> None:
        while self._held:
            oldest = next(iter(self._held))
            if self._held[oldest].expires_at > now:
                return
            self._dropped(oldest)

    def _drop(self, reservation_id: str) -> _Held:
        held = self._held.pop(reservation_id)
        self._add(held.endpoint, -1, -held.tokens)
        return held

    def _dropped(self, reservation_id: str) -> None:
        """Drop a reservation that was not released (expired, or one too many)."""
        held = self._drop(reservation_id)
        if self._on_drop is not None:
            self._on_drop(held.endpoint, held.tokens)

    def _add(self, endpoint: str, requests: int, tokens: int) -> None:
        old = self._load.get(endpoint, NO_LOAD)
        count = old.requests + requests
        if count <= 0:
            self._load.pop(endpoint, None)
        else:
            self._load[endpoint] = LoadCounts(count, old.tokens + tokens)

    def load_of(self, endpoint: str) -> LoadCounts:
        return self._load.get(endpoint, NO_LOAD)

    def counts(self) -> InFlight:
        """The live per-endpoint counts (read-only use)."""
        return self._load

    def clear(self) -> None:
        self._held.clear()
        self._load.clear()


class MemoryState:
    """The in-memory :class:`routing.state.protocol.RouterState` (one gateway process)."""

    __slots__ = ("_limits", "_clock", "_prefix", "_in_flight", "_sessions", "_windows")

    finishes_at_once = True  # finish does no I/O

    def __init__(self, limits: StateLimits | None = None, clock: Clock = time.monotonic,
                 on_expired: Callable[[str, int], None] | None = None) -> None:
        """``on_expired(endpoint, tokens)``: told of every reservation dropped without being
        released (its TTL passed, or one too many)."""
        self._limits = limits = limits or StateLimits()
        self._clock = clock
        self._prefix = PrefixIndex(limits.max_prefix_entries, limits.prefix_max_age_s, clock,
                                   refresh_s=REFRESH_S)
        self._in_flight = Reservations(limits.reservation_ttl_s, limits.max_reservations,
                                       on_expired)
        self._sessions = SessionMap(limits.max_sessions, limits.session_max_age_s)
        self._windows = WorkloadWindows(limits.window_requests, limits.max_models)

    @property
    def limits(self) -> StateLimits:
        return self._limits

    @property
    def prefix_layout(self) -> KeyLayout:
        """Which blocks of a chain the prefix index keeps as entries (a shared index that
        stands in for this one keeps the same)."""
        return self._prefix.layout

    def learned_output(self, model: str) -> float | None:
        return self._windows.mean_output(model)

    def view(self, ask: Ask) -> StateView:
        """Prefix matches and loads of ``ask.endpoints``, the model's prefix share and the
        session's endpoint, now (no I/O)."""
        now = self._clock()
        in_flight = self._in_flight
        in_flight.expire(now)
        counts = in_flight.counts()
        get = counts.get
        endpoints = ask.endpoints
        prefix = self._prefix
        return StateView(  # matched blocks, load, prefix share, session endpoint, ...
            prefix.match(ask.block_hashes, endpoints),
            {url: c for url in endpoints if (c := get(url)) is not None} if counts else {},
            self._windows.prefix_share(ask.model),
            self._sessions.get(ask.session, now) if ask.session else None,
            footprint=prefix.footprint,
            recent_requests=prefix.recent_requests_of,
        )

    async def read(self, ask: Ask) -> StateView:
        return self.view(ask)

    async def place(self, ask: Ask, choose: Callable[[StateView], C | None]) -> Placed[C] | None:
        """Atomic because it never awaits: read, choose, reserve each chosen endpoint."""
        view = self.view(ask)
        choice = choose(view)
        if choice is None:
            return None
        matched = view.matched_blocks
        urls = choice.urls
        if len(urls) == 1:  # one endpoint (no prefill/decode pair): no generator to run
            url = urls[0]
            return Placed(choice, (self.hold(url, ask.tokens, ask.block_hashes, None,
                                             matched.get(url, 0)),), view)
        held = tuple(self.hold(url, ask.tokens, ask.block_hashes, before=matched.get(url, 0))
                     for url in urls)
        return Placed(choice, held, view)

    def hold(self, endpoint: str, tokens: int, block_hashes: Sequence[int],
             rid: str | None = None, before: int | None = None) -> Reservation:
        """Reserve ``endpoint`` (id ``rid``, or a new one) and record ``block_hashes`` on it;
        ``before``: the leading blocks it held until now, when the caller just read it."""
        frm = self.record_blocks(endpoint, block_hashes, before)
        return self._in_flight.reserve(endpoint, tokens, self._clock(), rid, frm)

    def record_blocks(self, endpoint: str, block_hashes: Sequence[int],
                      before: int | None = None) -> int | None:
        """Record ``block_hashes`` as held by ``endpoint``; the first block it did not hold
        before (None when there are no blocks)."""
        if not block_hashes:
            return None
        if before is None:
            before = self._prefix.match(block_hashes, (endpoint,)).get(endpoint, 0)
        self._prefix.record(endpoint, block_hashes, held=before)
        return before

    async def finish(self, reservation: Reservation, outcome: Outcome) -> None:
        self.release(reservation)
        self.learn(reservation.endpoint, reservation.recorded_from, outcome)

    def release(self, reservation: Reservation) -> bool:
        """Stop counting ``reservation``; False when it was no longer held (finished before,
        or expired)."""
        self._in_flight.expire(self._clock())
        return self._in_flight.release(reservation.id)

    def learn(self, endpoint: str, recorded_from: int | None, outcome: Outcome) -> None:
        """What a request finished on ``endpoint`` teaches (see :meth:`finish`)."""
        if not outcome.succeeded:
            if recorded_from is not None:
                self._prefix.forget(endpoint, outcome.block_hashes[recorded_from:])
            return
        now = self._clock()
        hashes = outcome.block_hashes
        if hashes and not self._prefix.holds(endpoint, hashes[-1], now - REFRESH_S):
            self._prefix.record(endpoint, hashes, request=False)
        if outcome.session:
            self._sessions.bind(outcome.session, endpoint, now)
        self._windows.observe(outcome.model, outcome.prompt_tokens, outcome.matched_tokens,
                              outcome.output_tokens)

    def in_flight(self) -> InFlight:
        self._in_flight.expire(self._clock())
        return dict(self._in_flight.counts())

    async def aclose(self) -> None:
        self._prefix.clear()
        self._in_flight.clear()
        self._sessions.clear()

    def forget_endpoint(self, url: str) -> None:
        """Stop matching prefixes recorded for ``url`` (it restarted or left the fleet)."""
        self._prefix.forget_endpoint(url)

    def measures(self) -> WorkloadMeasures:
        """The workload windows, and this process's in-flight counts."""
        return WorkloadMeasures(window=self._windows.size, overall=self._windows.overall(),
                                by_model=self._windows.by_model(), in_flight=self.in_flight())

    def held_blocks(self) -> dict[str, int]:
        """Per endpoint URL, the distinct prompt blocks the prefix index holds for it (counted
        as cached now). O(entries): for scrape-time gauges."""
        return self._prefix.held_blocks()

    def sizes(self) -> StateSizes:
        return StateSizes(prefix_entries=len(self._prefix), sessions=len(self._sessions),
                          reservations=len(self._in_flight), models=self._windows.models())
