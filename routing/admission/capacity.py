"""Admission control's arithmetic: how many requests an endpoint runs at once, when it is full,
how long a request would wait for a slot, and how long it may. Pure: no I/O; clocks injected.

Capacity C_e [requests], learned from each new engine metrics reading (:class:`CapacityTracker`),
is the smaller of (1) a *ceiling*: the running count at a standing queue with a full KV cache
(:func:`next_ceiling`, forgotten after ``ceiling_ttl_s``), and (2) the requests that fill
``kv_target`` of the KV cache (:func:`kv_requests`; from its size while the engine runs
nothing). Neither known: never full. An endpoint is full when the router state's in-flight
requests on it ≥ C_e + ``allowance`` (:func:`full_endpoints`).

A request no endpoint has room for may wait its budget [s] (:func:`wait_budget_s`: TTFT SLO −
the pool's :class:`TtftFloor`, at most ``max_wait_s``); it joins the queue only when
:func:`likely_wait_s` at the pool's :class:`ReleaseRate` [releases/s] is within the budget,
else (or while the rate is unknown) it is refused at once (:func:`retry_after_s`).

See docs/routing.md#admission-arithmetic.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from routing.load import InFlight
from routing.snapshots import EngineMetrics, PoolSnapshot

NOTHING: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    """``allowance`` [requests]: an endpoint is full at C_e + allowance in flight.
    ``ceiling_ttl_s`` [s]: a learned ceiling is forgotten this long after it was set.
    ``kv_full`` [fraction of the KV cache]: a standing queue at this usage or more sets it.
    ``kv_target`` [fraction of the KV cache]: what the KV estimate fills."""

    allowance: int = 0
    ceiling_ttl_s: float = 60.0
    kv_full: float = 0.9
    kv_target: float = 0.9

    def __post_init__(self) -> None:
        if self.allowance < 0 or not self.ceiling_ttl_s > 0 or not 0 <= self.kv_full <= 1 \
                or not 0 < self.kv_target <= 1:
            raise ValueError("allowance must be >= 0, ceiling_ttl_s > 0, kv_full in [0, 1], "
                             "kv_target in (0, 1]")


@dataclass(frozen=True, slots=True)
class Ceiling:
    """A learned ceiling [requests] and when it was set [s, the caller's clock]."""

    requests: int
    at: float


def next_ceiling(ceiling: Ceiling | None, metrics: EngineMetrics, queued_before: bool,
                 now: float, config: CapacityConfig) -> Ceiling | None:
    """The ceiling after one metrics reading (docs/routing.md#admission-arithmetic, rule 1).
    ``queued_before``: whether the reading before it showed waiting > 0."""
    if ceiling is not None and now - ceiling.at > config.ceiling_ttl_s:
        ceiling = None
    running, waiting, usage = metrics.running, metrics.waiting, metrics.kv_cache_usage
    if running is None or waiting is None:
        return ceiling
    if waiting > 0 and queued_before and (usage is None or usage >= config.kv_full):
        return Ceiling(max(1, int(running)), now)
    if waiting == 0 and ceiling is not None and running > ceiling.requests:
        return Ceiling(int(running), now)
    return ceiling


def kv_requests(metrics: EngineMetrics, target: float) -> int | None:
    """Requests that fill ``target`` of the KV cache at the engine's current tokens per
    request: ⌊target × running ÷ usage⌋ (0.9 × 10 ÷ 0.5 → 18); None while it runs nothing or
    does not say."""
    running, usage = metrics.running, metrics.kv_cache_usage
    if running is None or usage is None or running < 1 or usage <= 0:
        return None
    return int(target * running / min(usage, 1.0))


def kv_tokens(metrics: EngineMetrics) -> int | None:
    """The KV cache's size [tokens]: blocks × tokens per block (2,500 × 16 = 40,000), or the
    size the engine states in tokens (SGLang)."""
    if metrics.kv_blocks_total is None or metrics.kv_block_size is None:
        return metrics.kv_capacity_tokens
    return metrics.kv_blocks_total * metrics.kv_block_size


@dataclass(frozen=True, slots=True)
class Limits:
    """What the full-check needs, per endpoint URL. ``at``: the in-flight requests at which it is
    full (C_e + allowance) where C_e is known from the engine; ``kv_tokens``: its KV size
    [tokens] where the engine runs nothing (C_e then comes from the state's tokens per request).
    ``allowance`` [requests]."""

    at: dict[str, int] = field(default_factory=dict)  # dicts: read on every placement
    kv_tokens: dict[str, int] = field(default_factory=dict)
    allowance: int = 0

    def __bool__(self) -> bool:
        """Whether any endpoint can be full."""
        return bool(self.at) or bool(self.kv_tokens)


NO_LIMITS = Limits()


def full_endpoints(load: InFlight, limits: Limits) -> frozenset[str]:
    """The endpoints of ``load`` (the state's in-flight counts) that are full. With KV size
    alone: C_e = ⌊kv_tokens × requests ÷ tokens⌋ (40,000 tokens, 10 requests holding 26,000 →
    15). Allocates nothing when none is full."""
    full: set[str] | None = None
    at, by_tokens = limits.at, limits.kv_tokens
    for url, counts in load.items():
        n = counts.requests
        limit = at.get(url)
        if limit is None:
            kv = by_tokens.get(url)
            if kv is None or counts.tokens <= 0:
                continue
            limit = kv * n // counts.tokens + limits.allowance
        if n >= limit:
            if full is None:
                full = set()
            full.add(url)
    return frozenset(full) if full else NOTHING


@dataclass(slots=True)
class _Seen:
    metrics: EngineMetrics | None = None
    queued: bool = False
    ceiling: Ceiling | None = None


class CapacityTracker:
    """Every endpoint's capacity, learned from the snapshots it is shown (each new metrics
    reading once), and which pool each endpoint is in. ``clock``: seconds, for the ceilings'
    ages. Not shared between processes."""

    __slots__ = ("_config", "_clock", "_seen", "_pools", "_limits", "_pool_of")

    def __init__(self, config: CapacityConfig = CapacityConfig(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config, self._clock = config, clock
        self._seen: dict[str, _Seen] = {}
        self._pools: tuple[PoolSnapshot, ...] | None = None
        self._limits = NO_LIMITS
        self._pool_of: dict[str, str] = {}

    def limits(self, pools: tuple[PoolSnapshot, ...]) -> Limits:
        """The limits for ``pools``: the same object again while the snapshot is the same."""
        if pools is not self._pools:
            self._pools = pools
            self._limits = self._learn(pools, self._clock())
        return self._limits

    def pool_of(self, url: str) -> str | None:
        return self._pool_of.get(url)

    def ceiling(self, url: str) -> Ceiling | None:
        seen = self._seen.get(url)
        return seen.ceiling if seen else None

    def _learn(self, pools: tuple[PoolSnapshot, ...], now: float) -> Limits:
        at: dict[str, int] = {}
        by_tokens: dict[str, int] = {}
        allowance = self._config.allowance
        for pool in pools:
            for ep in pool.endpoints:
                self._pool_of[ep.url] = pool.name
                seen = self._observe(ep.url, ep.metrics, now)
                known = [c for c in (seen.ceiling.requests if seen.ceiling else None,
                                     kv_requests(ep.metrics, self._config.kv_target))
                         if c is not None]
                if known:
                    at[ep.url] = min(known) + allowance
                elif (tokens := kv_tokens(ep.metrics)) is not None:
                    by_tokens[ep.url] = tokens
        self._forget_others(pools)
        return Limits(at, by_tokens, allowance) if at or by_tokens else NO_LIMITS

    def _forget_others(self, pools: tuple[PoolSnapshot, ...]) -> None:
        """Drop what was learned of endpoints no longer in ``pools`` (they left the fleet: an
        address a new engine takes later starts afresh)."""
        if len(self._seen) <= sum(len(p.endpoints) for p in pools):
            return
        present = {ep.url for p in pools for ep in p.endpoints}
        for url in [u for u in self._seen if u not in present]:
            del self._seen[url]
            self._pool_of.pop(url, None)

    def _observe(self, url: str, metrics: EngineMetrics, now: float) -> _Seen:
        seen = self._seen.setdefault(url, _Seen())
        if metrics is not seen.metrics:  # a new reading
            seen.ceiling = next_ceiling(seen.ceiling, metrics, seen.queued, now, self._config)
            seen.queued = (metrics.waiting or 0.0) > 0
            seen.metrics = metrics
        return seen


@dataclass(slots=True)
class ReleaseRate:
    """Slot releases per second in one pool: 1 ÷ the mean gap between releases, exponentially
    weighted, the time since the last one (or since the pool was last idle,
    :meth:`resume`) counting as a gap at least that long. ``weight``: of each new gap."""

    weight: float = 0.1
    mean_gap_s: float | None = None
    last_at: float | None = None

    def release(self, now: float) -> None:
        if self.last_at is not None:
            gap = max(0.0, now - self.last_at)
            mean = self.mean_gap_s
            self.mean_gap_s = gap if mean is None else mean + self.weight * (gap - mean)
        self.last_at = now

    def resume(self, now: float) -> None:
        """The pool holds a request again after holding none: the time it was idle is no gap
        (else the first wait after an idle hour would read as an hour per release)."""
        if self.last_at is not None:
            self.last_at = max(self.last_at, now)

    def per_s(self, now: float) -> float | None:
        """Releases/s (gaps 0.5 s → 2.0); None before any release."""
        if self.last_at is None:
            return None
        gap = max(self.mean_gap_s or 0.0, now - self.last_at, 1e-6)
        return 1.0 / gap


@dataclass(slots=True)
class TtftFloor:
    """The engine-side TTFT a request still has ahead of it once admitted [s]: mean +
    ``deviations`` × mean absolute deviation of the observed TTFTs, exponentially weighted; 0
    before any observation."""

    weight: float = 0.1
    deviations: float = 2.0
    mean_s: float | None = None
    deviation_s: float = 0.0

    def observe(self, ttft_s: float) -> None:
        if self.mean_s is None:
            self.mean_s, self.deviation_s = ttft_s, ttft_s / 2
            return
        error = ttft_s - self.mean_s
        self.mean_s += self.weight * error
        self.deviation_s += self.weight * (abs(error) - self.deviation_s)

    def floor_s(self) -> float:
        if self.mean_s is None:
            return 0.0
        return max(0.0, self.mean_s + self.deviations * self.deviation_s)


def wait_budget_s(ttft_slo_s: float | None, floor_s: float, max_wait_s: float) -> float:
    """How long a request may wait for a slot [s]: min(TTFT SLO − floor, ``max_wait_s``), ≥ 0
    (SLO 1.0, floor 0.4, max 10 → 0.6); ``max_wait_s`` without a TTFT SLO."""
    if ttft_slo_s is None:
        return max_wait_s
    return max(0.0, min(ttft_slo_s - floor_s, max_wait_s))


def expected_wait_s(ahead: int, releases_per_s: float) -> float:
    """[s] until a slot frees for a request with ``ahead`` requests before it: (ahead + 1) ÷
    rate (ahead 3 at 2 releases/s → 2.0 s)."""
    return (ahead + 1) / releases_per_s


def likely_wait_s(ahead: int, releases_per_s: float, deviations: float) -> float:
    """A wait for a slot [s] that a request with ``ahead`` requests before it will seldom
    exceed. Slots free up about at random — a Poisson stream at the pool's rate — so the wait
    for n = ahead + 1 of them is Erlang-distributed, mean n ÷ rate, standard deviation √n ÷
    rate; this is the mean plus ``deviations`` standard deviations (ahead 3 at 2 releases/s, 2
    deviations → (4 + 2 × 2) ÷ 2 = 4.0 s). One slot, 2 deviations: 3 ÷ rate, exceeded with
    probability e⁻³ ≈ 5 %; the mean alone would be exceeded 37 % of the time."""
    n = ahead + 1
    return (n + deviations * math.sqrt(n)) / releases_per_s


def retry_after_s(expected_s: float | None, budget_s: float) -> int:
    """The ``Retry-After`` of a refusal [whole seconds, ≥ 1]: how much longer than its budget
    the request would have waited, rounded up (expected 3.2, budget 0.6 → 3); 1 when unknown."""
    if expected_s is None or not math.isfinite(expected_s):
        return 1
    return max(1, math.ceil(expected_s - budget_s))

