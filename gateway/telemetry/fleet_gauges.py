"""What the router saw, as gauges read at scrape time: the fleet's endpoints and the workload.

- :class:`FleetGauges`: per ``{pool, endpoint}`` from the registry's snapshot, the endpoint's
  health and this gateway's in-flight requests on it (counted in the router state's
  reservations, the one place they are), and the engine's own figures as its dialect
  normalises them (a figure the engine does not export is left out); per ``model`` the
  workload windows the lever policy reads (:class:`routing.window.WorkloadMeasures`); per
  ``pool`` the in-flight load joined with the snapshot (:func:`routing.load.pool_summary`).
- :class:`CircuitGauges`: ``ridge_endpoint_circuit_open`` and ``ridge_lever_mismatch``;
  :class:`CapacityGauges`: ``ridge_endpoint_capacity_requests`` (admission control's).

Model names from clients are never labels: only configured models (and ``*``) are exported.
See docs/telemetry.md#fleet-and-workload-gauges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.registry.breaker import CircuitState
from backends.registry.endpoints import EndpointRegistry
from routing.load import NO_LOAD, InFlight, pool_summary
from routing.snapshots import EndpointSnapshot, PoolSnapshot
from routing.window import WindowMeasures, WorkloadMeasures

ALL_MODELS = "*"

Snapshot = Callable[[], Sequence[PoolSnapshot]]


class StateReadout(Protocol):
    """What the gauges read of the router state at each scrape (synchronous, cheap)."""

    def measures(self) -> WorkloadMeasures: ...

    def in_flight(self) -> InFlight: ...

    def held_blocks(self) -> Mapping[str, int]: ...

_EP = ("pool", "endpoint")
_ENGINE_GAUGES = (
    ("ridge_engine_requests_running", "Requests in the engine's running batch", "running"),
    ("ridge_engine_requests_waiting", "Requests waiting in the engine's queue", "waiting"),
    ("ridge_engine_kv_cache_usage_ratio", "Fraction of the engine's KV cache in use (0-1)",
     "kv_cache_usage"),
)
_ENGINE_COUNTERS = (
    ("ridge_engine_prefix_cache_queries", "Prompt tokens looked up in the engine's prefix cache",
     "prefix_cache_queries_total"),
    ("ridge_engine_prefix_cache_hits", "Prompt tokens found in the engine's prefix cache",
     "prefix_cache_hits_total"),
    ("ridge_engine_preemptions", "Requests the engine preempted (SGLang: retracted) for want "
     "of KV cache", "preemptions_total"),
)


class FleetGauges(Collector):
    """Endpoint and workload gauges (see the module). ``state`` None = no router state."""

    def __init__(self, snapshot: Snapshot, models: frozenset[str],
                 state: StateReadout | None = None) -> None:
        self._snapshot = snapshot
        self._models = models
        self._state = state

    def collect(self) -> Iterator[Metric]:
        pools = tuple(self._snapshot())
        own = self._state.in_flight() if self._state is not None else {}
        yield from endpoint_families(pools, own)
        if self._state is not None:
            measures = self._state.measures()
            yield from workload_families(measures, self._models)
            yield from pool_load_families(pools, measures)


class CircuitGauges(Collector):
    """The gauges read from the registry's endpoint statuses (:mod:`backends.registry.status`):
    ``ridge_endpoint_circuit_open`` {pool, endpoint}, 1 while the endpoint's circuit breaker is
    open or half-open, 0 when closed; ``ridge_lever_mismatch`` {pool, endpoint, lever}, 1 when
    its engine contradicts the pool's declared lever, 0 when it agrees, no series for a lever
    that could not be checked."""

    def __init__(self, registry: EndpointRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("ridge_endpoint_circuit_open", "1 while the endpoint's "
                                   "circuit breaker is open or half-open, else 0", labels=_EP)
        levers = GaugeMetricFamily("ridge_lever_mismatch", "1 when the endpoint's engine "
                                   "contradicts the lever its pool declares, 0 when it agrees",
                                   labels=(*_EP, "lever"))
        for url in self._registry.urls:
            status = self._registry.status(url)
            family.add_metric([status.pool, url],
                              0.0 if status.circuit is CircuitState.CLOSED else 1.0)
            check = status.lever_check
            for lever in check.checked:
                levers.add_metric([status.pool, url, lever],
                                  1.0 if check.mismatched(lever) else 0.0)
        yield family
        yield levers


Capacities = Callable[[], Sequence[tuple[str, str, int]]]
"""(pool, endpoint, requests) of every endpoint whose capacity admission control knows."""


class CapacityGauges(Collector):
    """``ridge_endpoint_capacity_requests`` {pool, endpoint}: the requests an endpoint holds
    before admission control counts it full (:meth:`gateway.access.admission.Admission.
    capacities`); no series where it is not known, or admission control is off."""

    def __init__(self, capacities: Capacities) -> None:
        self._capacities = capacities

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("ridge_endpoint_capacity_requests", "Requests the endpoint "
                                   "holds before admission control counts it full", labels=_EP)
        for pool, url, requests in self._capacities():
            family.add_metric([pool, url], float(requests))
        yield family


def endpoint_families(pools: Sequence[PoolSnapshot], own: InFlight) -> Iterator[Metric]:
    endpoints = [ep for pool in pools for ep in pool.endpoints]
    up = GaugeMetricFamily("ridge_endpoint_up", "1 when the endpoint's last health probe "
                           "passed, else 0", labels=_EP)
    in_flight = GaugeMetricFamily("ridge_endpoint_requests_in_flight", "This gateway's "
                                  "requests on the endpoint now", labels=_EP)
    per_pool = GaugeMetricFamily("ridge_requests_in_flight", "This gateway's requests being "
                                 "served now, by pool", labels=("pool",))
    for ep in endpoints:
        up.add_metric([ep.pool, ep.url], 1.0 if ep.healthy else 0.0)
        in_flight.add_metric([ep.pool, ep.url], float(own.get(ep.url, NO_LOAD).requests))
    for pool in pools:
        held = sum(own.get(ep.url, NO_LOAD).requests for ep in pool.endpoints)
        per_pool.add_metric([pool.name], float(held))
    yield from (up, in_flight, per_pool)
    for name, help_, attr in _ENGINE_GAUGES:
        yield _engine_family(GaugeMetricFamily(name, help_, labels=_EP), endpoints, attr)
    for name, help_, attr in _ENGINE_COUNTERS:
        yield _engine_family(CounterMetricFamily(name, help_, labels=_EP), endpoints, attr)


def _engine_family(family: GaugeMetricFamily | CounterMetricFamily,
                   endpoints: Iterable[EndpointSnapshot], attr: str) -> Metric:
    for ep in endpoints:
        value = getattr(ep.metrics, attr)
        if value is not None:
            family.add_metric([ep.pool, ep.url], float(value))
    return family


def workload_families(measures: WorkloadMeasures, models: frozenset[str]) -> Iterator[Metric]:
    scopes = [(ALL_MODELS, measures.overall)] + sorted(
        (m, w) for m, w in measures.by_model.items() if m in models
    )
    share = GaugeMetricFamily("ridge_prefix_share_ratio", "Prefix share f: matched prompt "
                              "tokens ÷ prompt tokens over the router's window", labels=("model",))
    count = GaugeMetricFamily("ridge_workload_window_requests", "Requests in the router's "
                              "workload window", labels=("model",))
    prompt = GaugeMetricFamily("ridge_workload_prompt_tokens", "Prompt length over the router's "
                               "window (tokens)", labels=("model", "stat"))
    output = GaugeMetricFamily("ridge_workload_output_tokens", "Output length over the router's "
                               "window (tokens)", labels=("model", "stat"))
    for model, window in scopes:
        count.add_metric([model], float(window.requests))
        if window.prefix_share is not None:
            share.add_metric([model], window.prefix_share)
        _lengths(prompt, model, window, output=False)
        _lengths(output, model, window, output=True)
    yield from (share, count, prompt, output)


def _lengths(family: GaugeMetricFamily, model: str, window: WindowMeasures, output: bool
             ) -> None:
    summary = window.output_tokens if output else window.prompt_tokens
    for stat, value in (("mean", summary.mean), ("p50", summary.p50), ("p90", summary.p90)):
        if value is not None:
            family.add_metric([model, stat], value)


def pool_load_families(pools: Iterable[PoolSnapshot], measures: WorkloadMeasures
                       ) -> Iterator[Metric]:
    tokens = GaugeMetricFamily("ridge_tokens_in_flight", "Tokens the router has in flight on "
                               "the pool's healthy endpoints (prompt to prefill + output to "
                               "decode)", labels=("pool",))
    concurrency = GaugeMetricFamily("ridge_pool_concurrency", "Requests on the pool's healthy "
                                    "endpoints, as the router counts them", labels=("pool",))
    per_endpoint = GaugeMetricFamily("ridge_pool_tokens_per_endpoint", "Tokens in flight per "
                                     "healthy endpoint", labels=("pool",))
    ridge = GaugeMetricFamily("ridge_pool_ridge_tokens", "Tokens in flight per step at which "
                              "the pool's decoding turns compute-bound", labels=("pool",))
    for pool in pools:
        load = pool_summary(pool, measures.in_flight)
        tokens.add_metric([pool.name], float(load.tokens_in_flight))
        concurrency.add_metric([pool.name], load.load)
        per_endpoint.add_metric([pool.name], load.tokens_per_endpoint)
        ridge.add_metric([pool.name], pool.ridge_tokens)
    yield from (tokens, concurrency, per_endpoint, ridge)
