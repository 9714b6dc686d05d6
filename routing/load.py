"""Load: what a request costs an endpoint, and what an endpoint and a pool carry.

The one definition of load, used by the lever policy, the replica scorers and the telemetry
gauges. Units: requests, tokens.

- A request reserves ``request_tokens`` [tokens] = prompt tokens + expected output tokens on
  the endpoint(s) it is sent to (prompt to prefill, output to decode). The router state counts
  every reservation (:class:`LoadCounts` per endpoint, :mod:`routing.state.protocol`): that is the
  one
  place in-flight requests are counted, and the gauges read it.
- ``endpoint_load`` [requests] = max(the router state's in-flight requests on the endpoint,
  the engine's running + waiting). A request sent through the gateway is in both counts once
  the engine has it, so the two are not added: the state's count is live and covers what the
  engine has not reported yet (its figures lag one metrics poll); the engine's covers requests
  that reached it some other way (a gateway that does not share this state, a direct client).
  Each request is counted once.
- ``pool_load`` [requests per endpoint] = mean ``endpoint_load`` over the healthy endpoints
  (``inf`` when none is healthy).
- ``pool_saturated``: every healthy endpoint's engine waiting queue [requests] is at least
  ``max_waiting`` (the engine has no batch room left anywhere in the pool).
- ``taken_since``: whether a choice made on a view of the in-flight requests is still fair
  when it is to be reserved, for router states shared by several deciders that choose outside
  the state's lock. Refused when a chosen endpoint gained more requests since the view than
  the endpoint of the request's candidates that gained the fewest (and than none, when every
  one lost some): another decider took it meanwhile. An endpoint that gained no more than the
  others (the whole fleet got busier evenly) is still a fair choice. The Redis state's script
  applies the same rule (:mod:`gateway.state.redis_script`).
- For the gauges, :func:`pool_summary` sums a pool's healthy endpoints: the state's requests
  and reserved tokens, the engine's running and waiting, the highest KV cache usage (a
  fraction in [0, 1]) and the load (Σ ``endpoint_load``). An unhealthy endpoint takes no new
  work; its stale figures would only distort the pool's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from routing.snapshots import EndpointSnapshot, PoolSnapshot
from routing.values import value


@value
class LoadCounts:
    """What the router state has in flight on one endpoint: requests, and tokens (prompt
    tokens still to prefill + output tokens still to decode, as estimated at reservation)."""

    requests: int = 0
    tokens: int = 0


NO_LOAD = LoadCounts()
InFlight = Mapping[str, LoadCounts]
"""The router state's in-flight counts by endpoint URL (missing = none)."""


def taken_since(seen: Mapping[str, int], now: Mapping[str, int], picks: Sequence[str]) -> bool:
    """Whether the choice of ``picks`` is refused (module docstring). ``seen``: the requests
    in flight on each candidate endpoint when the choice was made; ``now``: the same
    endpoints' requests now (missing = 0)."""
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
                   ) -> dict[str, float]:
    """:func:`endpoint_load` of each of ``endpoints``, by URL, written out in one loop (a
    scorer's: it runs for every candidate of every request)."""
    out: dict[str, float] = {}
    get = in_flight.get
    for ep in endpoints:
        counted = get(ep.url)
        requests = counted.requests if counted is not None else 0
        queued = ep.queued
        out[ep.url] = requests if requests > queued else queued
    return out


def pool_load(pool: PoolSnapshot, in_flight: InFlight) -> float:
    """Mean requests per healthy endpoint; ``inf`` when no endpoint is healthy."""
    healthy = pool.healthy_endpoints
    if not healthy:
        return math.inf
    total = 0.0
    for ep in healthy:  # endpoint_load written out: once per pool per decision
        counted = in_flight.get(ep.url)
        requests = counted.requests if counted is not None else 0
        total += requests if requests > ep.queued else ep.queued
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
