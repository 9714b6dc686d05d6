"""Workload measures: what the fleet is being asked to do, and how loaded each pool is.

Two kinds of measure:

- **Window measures** (:class:`WorkloadMeasures`), kept by the router state over its recent
  requests: the prefix share f = Σ matched prompt tokens ÷ Σ prompt tokens, prompt and
  output length distributions (count, mean, p50, p90, in tokens; the output mean is the
  running estimate of output tokens), overall and per model; plus the gateways' in-flight
  counts per endpoint.
- **Load** (:func:`endpoint_load`, :func:`pool_load`), computed from a frozen
  :class:`routing.types.PoolSnapshot` joined with the gateway counts of a
  :class:`routing.state.StateView` (or any URL → :class:`LoadCounts` table). The join:

  - ``requests`` = max(state's count, snapshot's ``in_flight``): the state counts every
    gateway, the snapshot this gateway's own requests, a subset;
  - ``tokens_in_flight`` = the state's reserved tokens (prompt to prefill + output to decode);
  - ``engine_running`` / ``engine_waiting`` / ``kv_usage``: the engine's own gauges (None → 0
    for the counts; unknown usage is left out of the maximum);
  - ``concurrency`` = max(requests, engine running + waiting): the gateway's requests are
    among the engine's (whose figures lag one poll), and the engine may also serve clients
    that bypass the gateway, so neither sum nor either alone is right.

  A pool's load sums its HEALTHY endpoints (an unhealthy endpoint takes no new work; its
  stale figures would only distort the pool's), and ``kv_usage_max`` is their highest KV
  cache usage (a fraction in [0, 1]).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from routing.state import LoadCounts, StateView
from routing.types import EndpointSnapshot, PoolSnapshot


@dataclass(frozen=True, slots=True)
class LengthSummary:
    """A length distribution (tokens): observations, mean, median, 90th percentile."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None


@dataclass(frozen=True, slots=True)
class WindowMeasures:
    """Measures over the recent requests of one scope (all models, or one model).

    ``requests``: requests in the window; ``prefix_share``: f in [0, 1] (None before any
    prompt token); ``output_tokens.mean`` is the running output-length estimate (tokens).
    """

    requests: int = 0
    prefix_share: float | None = None
    prompt_tokens: LengthSummary = field(default_factory=LengthSummary)
    output_tokens: LengthSummary = field(default_factory=LengthSummary)


@dataclass(frozen=True, slots=True)
class WorkloadMeasures:
    """What the telemetry shows of the workload: ``overall`` and ``by_model`` window
    measures over the last ``window`` requests, and gateway ``in_flight`` counts per
    endpoint URL."""

    window: int
    overall: WindowMeasures = field(default_factory=WindowMeasures)
    by_model: Mapping[str, WindowMeasures] = field(default_factory=dict)
    in_flight: Mapping[str, LoadCounts] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EndpointLoad:
    """One endpoint's load: gateway counts joined with the engine's gauges (see module)."""

    url: str
    healthy: bool
    requests: int
    tokens_in_flight: int
    engine_running: float
    engine_waiting: float
    kv_usage: float | None

    @property
    def concurrency(self) -> float:
        """Requests on the endpoint: max(gateway requests, engine running + waiting)."""
        return max(float(self.requests), self.engine_running + self.engine_waiting)


@dataclass(frozen=True, slots=True)
class PoolLoad:
    """A pool's load, summed over its healthy endpoints (see module)."""

    pool: str
    requests: int
    tokens_in_flight: int
    engine_running: float
    engine_waiting: float
    kv_usage_max: float | None
    healthy: int
    endpoints: int
    concurrency: float

    @property
    def tokens_per_endpoint(self) -> float:
        """Tokens in flight per healthy endpoint (0 when none is healthy), the figure to
        hold against the pool's ``ridge_tokens``."""
        return self.tokens_in_flight / self.healthy if self.healthy else 0.0


LoadSource: TypeAlias = StateView | Mapping[str, LoadCounts] | None


def _counts(source: LoadSource, url: str) -> LoadCounts:
    if source is None:
        return LoadCounts()
    if isinstance(source, StateView):
        return source.load_of(url)
    return source.get(url, LoadCounts())


def endpoint_load(endpoint: EndpointSnapshot, source: LoadSource = None) -> EndpointLoad:
    """``endpoint``'s load, its gateway counts taken from ``source``."""
    counts = _counts(source, endpoint.url)
    metrics = endpoint.metrics
    return EndpointLoad(
        url=endpoint.url,
        healthy=endpoint.healthy,
        requests=max(counts.requests, endpoint.in_flight),
        tokens_in_flight=counts.tokens,
        engine_running=metrics.running or 0.0,
        engine_waiting=metrics.waiting or 0.0,
        kv_usage=metrics.kv_cache_usage,
    )


def pool_load(pool: PoolSnapshot, source: LoadSource = None) -> PoolLoad:
    """``pool``'s load over its healthy endpoints, gateway counts from ``source``."""
    loads = [endpoint_load(ep, source) for ep in pool.healthy_endpoints]
    usages = [x.kv_usage for x in loads if x.kv_usage is not None]
    return PoolLoad(
        pool=pool.name,
        requests=sum(x.requests for x in loads),
        tokens_in_flight=sum(x.tokens_in_flight for x in loads),
        engine_running=sum(x.engine_running for x in loads),
        engine_waiting=sum(x.engine_waiting for x in loads),
        kv_usage_max=max(usages) if usages else None,
        healthy=len(loads),
        endpoints=len(pool.endpoints),
        concurrency=sum(x.concurrency for x in loads),
    )


def pool_loads(pools: Iterable[PoolSnapshot], source: LoadSource = None) -> dict[str, PoolLoad]:
    """Every pool's load, by pool name."""
    return {pool.name: pool_load(pool, source) for pool in pools}
