"""Load: what a request costs an endpoint, and what an endpoint and a pool carry.

The one definition of load, used by the lever policy, the replica scorers and the telemetry
gauges. Units: requests, tokens.

- :func:`request_tokens` [tokens] = prompt + expected output: what a request reserves on the
  endpoints it is sent to. The router state counts every reservation (:class:`LoadCounts` per
  endpoint, :mod:`routing.state.protocol`): the one place in-flight requests are counted.
- :func:`endpoint_load` [requests] = max(the state's in-flight requests, the engine's running +
  waiting): each request counted once, the state's count live, the engine's covering requests
  that reached it some other way.
- :func:`pool_load` [requests per endpoint]: the mean over the healthy endpoints (``inf`` when
  none); :func:`pool_saturated`: every healthy endpoint's waiting queue ≥ ``max_waiting``.
- :func:`taken_since`: whether a choice made outside a shared state's lock is still fair;
  :func:`pool_summary`: a pool's figures for the gauges, over its healthy endpoints.

See docs/routing.md#load-and-cache-cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from routing.native_value import NativeValue
from routing.snapshots import EndpointSnapshot, PoolSnapshot


class LoadCounts(NativeValue):
    """What the router state has in flight on one endpoint: requests, and tokens (prompt
    tokens still to prefill + output tokens still to decode, as estimated at reservation)."""

    FIELDS = ("requests", "tokens")
    __slots__ = FIELDS

    def __init__(self, requests: int = 0, tokens: int = 0) -> None:
        self.requests: Final = requests
        self.tokens: Final = tokens


NO_LOAD = LoadCounts()
InFlight = dict[str, LoadCounts]
"""The router state's in-flight counts by endpoint URL (missing = none)."""


def taken_since(seen: Mapping[str, int], now: Mapping[str, int], picks: Sequence[str]) -> bool:
    """Whether the choice of ``picks`` is refused: a chosen endpoint gained more requests since
    the view than the candidate that gained the fewest (and than none, when every one lost
    some), so another decider took it meanwhile (docs/routing.md#load-and-cache-cost).
    ``seen``: the requests in flight on each candidate endpoint when the choice was made;
    ``now``: the same endpoints' requests now (missing = 0)."""
    least = min((now.get(url, 0) - held for url, held in seen.items()), default=0)
    floor = least if least > 0 else 0
    return any(now.get(url, 0) - seen.get(url, 0) > floor for url in picks)


def request_tokens(prompt_tokens: int, expected_output_tokens: int) -> int:
    """What one request reserves on an endpoint [tokens]: prompt + expected output, ≥ 0."""
    return max(0, prompt_tokens + expected_output_tokens)


def endpoint_load(ep: EndpointSnapshot, in_flight: InFlight) -> float:
    """Requests on ``ep``: the larger of the state's in-flight count and the engine's
    running + waiting."""
    return max(in_flight.get(ep.url, NO_LOAD).requests, ep.queued)


def endpoint_loads(endpoints: Iterable[EndpointSnapshot], in_flight: InFlight
                   ) -> list[float]:
    """:func:`endpoint_load` of each of ``endpoints``, in their order, written out in one loop
    (a scorer's: it runs for every candidate of every request)."""
    out: list[float] = []
    for ep in endpoints:
        counted = in_flight.get(ep.url)
        requests = float(counted.requests) if counted is not None else 0.0
        queued = ep.queued
        out.append(requests if requests > queued else queued)
    return out


def pool_load(pool: PoolSnapshot, in_flight: InFlight) -> float:
    """Mean requests per healthy endpoint; ``inf`` when no endpoint is healthy."""
    healthy = pool.healthy_endpoints
    if not healthy:
        return math.inf
    total = 0.0
    for ep in healthy:  # endpoint_load written out: once per pool per decision
        counted = in_flight.get(ep.url)
        requests = float(counted.requests) if counted is not None else 0.0
        queued = ep.queued
        total += requests if requests > queued else queued
    return total / len(healthy)


def pool_saturated(pool: PoolSnapshot, max_waiting: float) -> bool:
    """True when the pool has healthy endpoints and every one has ≥ ``max_waiting`` waiting."""
    healthy = pool.healthy_endpoints
    return bool(healthy) and all((ep.metrics.waiting or 0.0) >= max_waiting for ep in healthy)


@dataclass(frozen=True, slots=True)
class PoolLoad:
    """A pool's load for the gauges, summed over its healthy endpoints (see the module)."""

    pool: str
    requests: int
    tokens_in_flight: int
    engine_running: float
    engine_waiting: float
    kv_usage_max: float | None
    healthy: int
    endpoints: int
    load: float

    @property
    def tokens_per_endpoint(self) -> float:
        """Tokens in flight per healthy endpoint (0 when none is healthy), the figure to
        hold against the pool's ``ridge_tokens``."""
        return self.tokens_in_flight / self.healthy if self.healthy else 0.0


def pool_summary(pool: PoolSnapshot, in_flight: InFlight) -> PoolLoad:
    """``pool``'s load over its healthy endpoints, in-flight counts from ``in_flight``."""
    healthy = pool.healthy_endpoints
    counts = [in_flight.get(ep.url, NO_LOAD) for ep in healthy]
    usages = [u for ep in healthy if (u := ep.metrics.kv_cache_usage) is not None]
    return PoolLoad(
        pool=pool.name,
        requests=sum(c.requests for c in counts),
        tokens_in_flight=sum(c.tokens for c in counts),
        engine_running=sum(ep.metrics.running or 0.0 for ep in healthy),
        engine_waiting=sum(ep.metrics.waiting or 0.0 for ep in healthy),
        kv_usage_max=max(usages) if usages else None,
        healthy=len(healthy),
        endpoints=len(pool.endpoints),
        load=sum(endpoint_load(ep, in_flight) for ep in healthy),
    )
