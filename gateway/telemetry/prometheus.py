"""ridge's own Prometheus metrics, on a registry the app is given (never the global one).

Names follow Prometheus conventions (``ridge_`` prefix, base units, ``_total`` only on
counters, histograms rather than averaged gauges), and every label value is bounded: ``model``
a configured model (else ``other``), ``pool`` a pool (else ``none``), ``lever`` a lever (else
``none``), ``reason`` a route reason, ``slo_class`` a class of the fleet's SLOs. The counters
and histograms are :mod:`gateway.telemetry.lean_metrics`' (every update and scrape runs on the
event loop's thread).

:class:`Telemetry` records each finished request (:meth:`Telemetry.record`: volume, latency,
tokens, goodput, the MFU/MBU ledger, the prefix reuse lost; :meth:`Telemetry.count` for one
that ran no model), each route decision (:meth:`Telemetry.route`) and admission control's
refusals and waits; once bound to a fleet (:meth:`Telemetry.bind_fleet`) it adds the
scrape-time collectors. Unknown SLO classes are counted and logged once (:class:`UnknownClasses`).
See docs/telemetry.md#the-metrics-registry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics import MetricWrapperBase

from config.fleet import Fleet
from config.plan_section import PlanSection
from gateway.telemetry.efficiency import EfficiencyCollector, Snapshot, TokenLedger, endpoint_facts
from gateway.telemetry.fleet_gauges import FleetGauges, StateReadout
from gateway.telemetry.lean_metrics import Buckets, LeanCounter, LeanHistogram, Tally
from gateway.telemetry.slos import SloPolicy, slo_policy
from gateway.telemetry.walls import PoolCounts, PoolWalls
from routing.binding_wall import lost_tokens
from routing.formulas import TPOT, Measured, RequestTokens, evaluate
from routing.native_value import NativeValue
from routing.router import RoutePlan

# Buckets for LLM latencies, seconds. TTFT spans cached short prompts (~10 ms) to queued long
# prefills (a minute); TPOT a fast GPU decode step (~5 ms) to a saturated CPU (~1 s).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60)
# Time to first byte of a non-streamed answer: the TTFT range, then on to a whole long answer.
TTFB_BUCKETS = (*TTFT_BUCKETS, 90, 120, 180, 300, 600)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.5, 0.75, 1.0, 2.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300,
               600)
# Scheduler plugins: a microsecond to 10 ms, seconds.
PLUGIN_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2)
# Waiting at the gateway for a slot: 5 ms to a minute, seconds.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60)
# Token counts: powers of two from 1 to 128k tokens.
TOKEN_BUCKETS = tuple(float(2**i) for i in range(18))

OTHER_MODEL = "other"
NO_POOL = "none"
NO_LEVER = "none"

log = logging.getLogger("ridge")


class UnknownClasses:
    """Logs each (model, SLO class) pair a client named that the model does not define, once
    — at most ``limit`` pairs (both names come from clients), then one line saying that more
    go unlogged (``ridge_slo_class_unknown_requests_total`` still counts them)."""

    def __init__(self, limit: int = 256) -> None:
        self._logged: set[tuple[str, str]] = set()
        self._limit = limit

    def seen(self, model: str, requested: str, slos: SloPolicy, used: str) -> None:
        key = (model[:64], requested[:64])
        if key in self._logged or len(self._logged) > self._limit:
            return
        self._logged.add(key)
        if len(self._logged) > self._limit:
            log.warning("more unknown x-ridge-slo-class values were named; not logging them")
            return
        log.warning("x-ridge-slo-class %r is not an SLO class of model %r (its classes: %s); "
                    "its requests are held against class %r (logged once)", key[1], key[0],
                    ", ".join(slos.classes_of(model)) or "none", used)


class RequestRecord(NativeValue):
    """One finished request, as telemetry records it. Times in seconds; None = not measured.

    ``lever``: the route decision's lever; ``endpoint``: the URL that served it (the prefill
    side of a prefill/decode pair, ``decode_endpoint`` the decode side); token counts from the
    engine's usage (``cached_tokens``: ``prompt_tokens_details.cached_tokens`` when the engine
    reports it); ``itl_s``: the stream's inter-token gaps, one per content event after the
    first; ``max_tokens`` and ``slo_class`` (the client's ``x-ridge-slo-class`` header) choose
    the SLO class; ``ttfb_s``: non-streamed answers, from arrival until the engine's response
    headers; ``predicted_cached_tokens``: prompt tokens the router's prefix index said
    ``endpoint`` held when it placed the request (None: not known, or a prefill/decode pair).
    """

    FIELDS = ("model", "pool", "status", "e2e_s", "ttft_s", "completion_tokens", "lever",
              "endpoint", "decode_endpoint", "prompt_tokens", "cached_tokens", "itl_s",
              "max_tokens", "slo_class", "ttfb_s", "predicted_cached_tokens")
    __slots__ = FIELDS

    def __init__(self, model: str, pool: str, status: int, e2e_s: float,
                 ttft_s: float | None = None, completion_tokens: int | None = None,
                 lever: str | None = None, endpoint: str | None = None,
                 decode_endpoint: str | None = None, prompt_tokens: int | None = None,
                 cached_tokens: int | None = None, itl_s: tuple[float, ...] = (),
                 max_tokens: int | None = None, slo_class: str | None = None,
                 ttfb_s: float | None = None,
                 predicted_cached_tokens: int | None = None) -> None:
        self.model: Final = model
        self.pool: Final = pool
        self.status: Final = status
        self.e2e_s: Final = e2e_s
        self.ttft_s: Final = ttft_s
        self.completion_tokens: Final = completion_tokens
        self.lever: Final = lever
        self.endpoint: Final = endpoint
        self.decode_endpoint: Final = decode_endpoint
        self.prompt_tokens: Final = prompt_tokens
        self.cached_tokens: Final = cached_tokens
        self.itl_s: Final = itl_s
        self.max_tokens: Final = max_tokens
        self.slo_class: Final = slo_class
        self.ttfb_s: Final = ttfb_s
        self.predicted_cached_tokens: Final = predicted_cached_tokens

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (e2e − TTFT) / (tokens − 1), seconds."""
        if self.ttft_s is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)

    @property
    def tokens(self) -> RequestTokens:
        return RequestTokens.clamped(self.prompt_tokens, self.cached_tokens,
                                     self.completion_tokens)


class Telemetry:
    """The gateway's metrics; one instance per app, on an injected registry.

    ``slos``: the SLO policy (default: none, every evaluated request is good). ``clock``:
    monotonic seconds for the MFU/MBU accounting (injected by tests).
    """

    def __init__(self, metrics_registry: CollectorRegistry, models: frozenset[str], *,
                 slos: SloPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics_registry = metrics_registry
        self._models = models
        self._clock = clock
        self.slos = SloPolicy()
        self.ledger: TokenLedger | None = None
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}
        self._reuse_children: dict[str, tuple[Any, Any]] = {}
        self._series: dict[tuple[str, str, str | None], _Series] = {}
        self._collectors: tuple[EfficiencyCollector, FleetGauges, PoolWalls] | None = None
        self._unknown_classes = UnknownClasses()
        self._request_metrics(metrics_registry)
        self._token_metrics(metrics_registry)
        self._reuse_metrics(metrics_registry)
        self._goodput_metrics(metrics_registry)
        self._admission_metrics(metrics_registry)
        self.use_slos(slos or SloPolicy())

    def _request_metrics(self, registry: CollectorRegistry) -> None:
        labels = ("model", "pool", "lever")
        self.requests = LeanCounter(
            "ridge_requests", "Requests finished, by HTTP status",
            ("model", "pool", "status"), registry=registry,
        )
        self.e2e = LeanHistogram(
            "ridge_request_duration_seconds", "End-to-end request latency",
            labels, buckets=E2E_BUCKETS, registry=registry,
        )
        self.ttft = LeanHistogram(
            "ridge_time_to_first_token_seconds", "Time to the first generated token",
            labels, buckets=TTFT_BUCKETS, registry=registry,
        )
        self.ttfb = LeanHistogram(
            "ridge_time_to_first_byte_seconds", "Time to the first byte of the engine's answer "
            "(non-streamed answers)", labels, buckets=TTFB_BUCKETS, registry=registry,
        )
        self.tpot = LeanHistogram(
            "ridge_time_per_output_token_seconds", "Mean time per output token after the first",
            labels, buckets=TPOT_BUCKETS, registry=registry,
        )
        self.itl = LeanHistogram(
            "ridge_inter_token_latency_seconds", "Time between two content events of a stream",
            labels, buckets=TPOT_BUCKETS, registry=registry,
        )
        self.retries = LeanCounter(
            "ridge_upstream_retries", "Requests retried on another endpoint", ("pool",),
            registry=registry,
        )
        self.broken_answers = LeanCounter(
            "ridge_upstream_broken_answers", "Engine answers with status 200 that were not "
            "whole (empty, cut short, not the API's answer, a stream without its end), by "
            "reason", ("pool", "reason"), registry=registry,
        )
        self.route_decisions = LeanCounter(
            "ridge_route_decisions", "Route decisions, by pool, lever and reason",
            ("pool", "lever", "reason"), registry=registry,
        )
        self.plugin_duration = LeanHistogram(
            "ridge_scheduler_plugin_duration_seconds", "Time one replica-scheduler plugin "
            "took to filter, score or pick for one request", ("plugin",),
            buckets=PLUGIN_BUCKETS, registry=registry,
        )
        self.state_backend_up = Gauge(
            "ridge_state_backend_up", "1 while the shared router state answers (0: routing on "
            "this gateway's local state)", ("backend",), registry=registry,
        )

    def _token_metrics(self, registry: CollectorRegistry) -> None:
        labels = ("model", "pool", "lever")
        self.prompt_tokens = LeanCounter(
            "ridge_prompt_tokens", "Prompt tokens of finished requests (engine usage)", labels,
            registry=registry,
        )
        self.completion_tokens = LeanCounter(
            "ridge_completion_tokens", "Generated tokens of finished requests (engine usage)",
            labels, registry=registry,
        )
        self.cached_tokens = LeanCounter(
            "ridge_cached_prompt_tokens", "Prompt tokens the engine served from its prefix "
            "cache (when its usage says)", labels, registry=registry,
        )
        self.prompt_lengths = LeanHistogram(
            "ridge_request_prompt_tokens", "Prompt length of finished requests (tokens)",
            ("model", "pool"), buckets=TOKEN_BUCKETS, registry=registry,
        )
        self.completion_lengths = LeanHistogram(
            "ridge_request_completion_tokens", "Output length of finished requests (tokens)",
            ("model", "pool"), buckets=TOKEN_BUCKETS, registry=registry,
        )

    def _reuse_metrics(self, registry: CollectorRegistry) -> None:
        self.prefix_predicted = LeanCounter(
            "ridge_prefix_predicted_tokens", "Prompt tokens the router's prefix index said the "
            "chosen endpoint held when it placed the request (requests whose engine reports "
            "its cached tokens)", ("pool",), registry=registry,
        )
        self.prefix_lost = LeanCounter(
            "ridge_prefix_lost_tokens", "Of the predicted prompt tokens, those the engine "
            "recomputed (not in its cache any more: evicted)", ("pool",), registry=registry,
        )

    def _goodput_metrics(self, registry: CollectorRegistry) -> None:
        labels = ("model", "pool", "lever", "slo_class")
        self.slo_evaluated = LeanCounter(
            "ridge_slo_evaluated_requests", "Finished requests held against their SLO "
            "(2xx and 5xx; client errors are not)", labels, registry=registry,
        )
        self.goodput = LeanCounter(
            "ridge_goodput_requests", "Finished requests that met every bound of their SLO",
            labels, registry=registry,
        )
        self.slo_violations = LeanCounter(
            "ridge_slo_violations", "Finished requests that broke a bound, by bound",
            (*labels, "slo"), registry=registry,
        )
        self.slo_objective = Gauge(
            "ridge_slo_objective_seconds", "The configured SLO bounds",
            ("model", "slo_class", "slo"), registry=registry,
        )
        self.slo_class_unknown = LeanCounter(
            "ridge_slo_class_unknown_requests", "Finished requests whose x-ridge-slo-class "
            "names no class of their model (held against the default choice)", ("model",),
            registry=registry,
        )

    def _admission_metrics(self, registry: CollectorRegistry) -> None:
        self.admission_rejections = LeanCounter(
            "ridge_admission_rejected", "Requests refused by admission control (503), by "
            "reason", ("pool", "reason"), registry=registry,
        )
        self.admission_queue_depth = Gauge(
            "ridge_admission_queue_depth", "Requests waiting at the gateway for a slot in a "
            "pool", ("pool",), registry=registry,
        )
        self.admission_wait = LeanHistogram(
            "ridge_admission_wait_seconds", "How long requests admitted after waiting for a "
            "slot waited at the gateway", ("pool",), buckets=WAIT_BUCKETS, registry=registry,
        )

    def admission_pools(self, pools: Iterable[str], reasons: Iterable[str]) -> None:
        """Start every pool's admission series at 0 (refusals by reason, queue depth), so that
        a dashboard shows 0 rather than nothing before the first refusal."""
        reasons = tuple(reasons)
        for pool in pools:
            for reason in reasons:
                self.child(self.admission_rejections, pool, reason)
            self.child(self.admission_queue_depth, pool).set(0)

    def admission_refused(self, pool: str, reason: str) -> None:
        self.child(self.admission_rejections, pool, reason).inc()

    def admission_queue(self, pool: str, depth: int) -> None:
        self.child(self.admission_queue_depth, pool).set(depth)

    def admission_waited(self, pool: str, seconds: float) -> None:
        self.child(self.admission_wait, pool).observe(seconds)

    def model_label(self, model: str | None) -> str:
        return model if model in self._models else OTHER_MODEL

    def use_slos(self, slos: SloPolicy) -> None:
        """Evaluate goodput against ``slos`` from now on, and export their bounds."""
        self.slos = slos
        self.slo_objective.clear()
        for model, slo in slos.models.items():
            for class_name in (None, *(c.name for c in slo.classes)):
                name, bounds = slo.resolve(None, class_name)
                for bound, seconds in bounds.by_name().items():
                    self.slo_objective.labels(model, name, bound).set(seconds)

    def bind_fleet(self, fleet: Fleet, snapshot: Snapshot,
                   state: StateReadout | None = None,
                   plan: Callable[[], PlanSection | None] | None = None) -> EfficiencyCollector:
        """Take the fleet's SLOs and register the MFU/MBU and fleet/workload collectors on
        this registry. ``snapshot``: the endpoint registry's ``snapshot``; ``state``: the
        router state (None: no in-flight and workload gauges); ``plan``: the fleet file's plan
        now (default: ``fleet``'s). Binding again is a no-op."""
        if self._collectors is not None:
            return self._collectors[0]
        self.use_slos(slo_policy(fleet))
        self.ledger = TokenLedger(endpoint_facts(fleet), clock=self._clock)
        efficiency = EfficiencyCollector(self.ledger, snapshot)
        gauges = FleetGauges(snapshot, self._models, state)
        walls = PoolWalls(snapshot, fleet, self.pool_totals, lambda: self.ledger, state,
                          clock=self._clock, plan=plan)
        for collector in (efficiency, gauges, walls):
            self.metrics_registry.register(collector)
        self._collectors = (efficiency, gauges, walls)
        return efficiency

    def pool_totals(self) -> dict[str, PoolCounts]:
        """Per pool, the totals the binding-wall rule reads from these counters: predicted and
        lost prefix tokens, prompt, cached and completion tokens, SLO-evaluated requests and
        TPOT violations (read from the metrics' samples: a scrape's work)."""
        sums = [_by_pool(self.prefix_predicted), _by_pool(self.prefix_lost),
                _by_pool(self.prompt_tokens), _by_pool(self.cached_tokens),
                _by_pool(self.completion_tokens), _by_pool(self.slo_evaluated),
                _by_pool(self.slo_violations, slo=TPOT)]
        pools = set().union(*sums) - {NO_POOL}
        return {pool: PoolCounts(*(s.get(pool, 0.0) for s in sums)) for pool in pools}

    def child(self, metric: MetricWrapperBase, *values: str) -> Any:
        """``metric.labels(*values)``, bound once and kept (label values are bounded sets):
        the hot path pays a dictionary look-up, not the client library's label handling."""
        key = (metric, values)
        bound = self._children.get(key)
        if bound is None:
            bound = self._children[key] = metric.labels(*values)
        return bound

    def retries_of(self, pool: str) -> Any:
        """The retry counter of ``pool``."""
        return self.child(self.retries, pool)

    def broken_answer(self, pool: str, reason: str) -> None:
        """Count one broken 200 answer of ``pool`` (:data:`gateway.request.answers.REASONS`)."""
        self.child(self.broken_answers, pool, reason).inc()

    def route(self, plan: RoutePlan) -> None:
        """Count one route decision and time its scheduler plugins."""
        decision = plan.decision
        self.child(self.route_decisions, decision.pool, decision.lever, decision.reason).inc()
        for timing in plan.timings:
            self.child(self.plugin_duration, timing.name).observe(timing.ns * 1e-9)

    def count(self, rec: RequestRecord) -> None:
        """Count a request that ran no model on the engine (tokenize, detokenize) in
        ``ridge_requests_total`` only: its model's latencies, tokens and goodput are those of
        inference."""
        self.child(self.requests, self.model_label(rec.model), rec.pool, str(rec.status)).inc()

    def record(self, rec: RequestRecord) -> None:
        model = self.model_label(rec.model)
        if rec.pool == NO_POOL:
            self.child(self.requests, model, rec.pool, str(rec.status)).inc()
            return
        series = self._series.get((model, rec.pool, rec.lever))
        if series is None:
            series = self._new_series(model, rec.pool, rec.lever)
        series.status(rec.status).add(1.0)
        self._latencies(rec, series)
        self._tokens(rec, series)
        self._goodput(rec, series)
        if self.ledger is not None and rec.endpoint is not None:
            self.ledger.observe(rec.endpoint, rec.tokens, rec.e2e_s, rec.ttft_s, gaps=rec.itl_s,
                                decode_url=rec.decode_endpoint)

    def _new_series(self, model: str, pool: str, lever: str | None) -> _Series:
        series = self._series[(model, pool, lever)] = _Series(
            self, (model, pool, lever or NO_LEVER))
        return series

    def _latencies(self, rec: RequestRecord, series: _Series) -> None:
        series.buckets(self.e2e).observe(rec.e2e_s)
        if rec.ttft_s is not None:
            series.buckets(self.ttft).observe(rec.ttft_s)
        elif rec.ttfb_s is not None:
            series.buckets(self.ttfb).observe(rec.ttfb_s)
        tpot = rec.tpot_s
        if tpot is not None:
            series.buckets(self.tpot).observe(tpot)
        if rec.itl_s:
            series.buckets(self.itl).observe_all(rec.itl_s)

    def _tokens(self, rec: RequestRecord, series: _Series) -> None:
        if rec.prompt_tokens is not None:
            series.tally(self.prompt_tokens).add(rec.prompt_tokens)
            series.buckets(self.prompt_lengths, 2).observe(rec.prompt_tokens)
        if rec.completion_tokens is not None:
            series.tally(self.completion_tokens).add(rec.completion_tokens)
            series.buckets(self.completion_lengths, 2).observe(rec.completion_tokens)
        if rec.cached_tokens is not None:
            series.tally(self.cached_tokens).add(rec.cached_tokens)
            if rec.predicted_cached_tokens is not None:
                self._reuse(rec.pool, rec.predicted_cached_tokens, rec.cached_tokens,
                            rec.prompt_tokens)

    def _reuse(self, pool: str, predicted: int, cached: int, prompt: int | None) -> None:
        """Count one request's predicted and lost prefix tokens (one look-up of the pool's two
        bound counters)."""
        bound = self._reuse_children.get(pool)
        if bound is None:
            bound = self._reuse_children[pool] = (self.prefix_predicted.labels(pool),
                                                  self.prefix_lost.labels(pool))
        predicted, lost = lost_tokens(predicted, cached, prompt)
        if predicted:  # the series exist from their first look-up, at 0
            bound[0].inc(predicted)
            if lost:
                bound[1].inc(lost)

    def _goodput(self, rec: RequestRecord, series: _Series) -> None:
        slo_class, bounds = self.slos.bounds_for(rec.model, rec.max_tokens, rec.slo_class)
        if rec.slo_class and slo_class != rec.slo_class:
            self.child(self.slo_class_unknown, series.labels[0]).inc()
            self._unknown_classes.seen(rec.model, rec.slo_class, self.slos, slo_class)
        verdict = evaluate(bounds, Measured(rec.status, rec.e2e_s, rec.ttft_s, rec.tpot_s))
        if not verdict.evaluated:
            return
        series.of_class(self.slo_evaluated, slo_class).add(1.0)
        if verdict.good:
            series.of_class(self.goodput, slo_class).add(1.0)
        for slo in verdict.violated:
            self.child(self.slo_violations, *series.labels, slo_class, slo).inc()


class _Series:
    """The series that finished requests of one (model, pool, lever) update, each bound at its
    first update and kept (label values are bounded sets): recording a request pays one
    look-up of this bundle, then one per series by metric and a direct call on its native
    value (:class:`~gateway.telemetry.lean_metrics.Tally`,
    :class:`~gateway.telemetry.lean_metrics.Buckets`), not the building of label keys."""

    __slots__ = ("labels", "_telemetry", "_tallies", "_buckets", "_by_class", "_statuses")

    def __init__(self, telemetry: Telemetry, labels: tuple[str, str, str]) -> None:
        self.labels = labels
        self._telemetry = telemetry
        self._tallies: dict[MetricWrapperBase, Tally] = {}
        self._buckets: dict[MetricWrapperBase, Buckets] = {}
        self._by_class: dict[tuple[MetricWrapperBase, str], Tally] = {}
        self._statuses: dict[int, Tally] = {}

    def status(self, status: int) -> Tally:
        """``ridge_requests_total`` of this model and pool with ``status``."""
        bound = self._statuses.get(status)
        if bound is None:
            model, pool, _ = self.labels
            bound = self._statuses[status] = self._telemetry.child(
                self._telemetry.requests, model, pool, str(status)).tally
        return bound

    def tally(self, metric: LeanCounter, arity: int = 3) -> Tally:
        """The counter ``metric`` bound to the first ``arity`` of (model, pool, lever): its
        label names (a metric is always bound with the same ``arity``)."""
        bound = self._tallies.get(metric)
        if bound is None:
            bound = self._tallies[metric] = self._telemetry.child(
                metric, *self.labels[:arity]).tally
        return bound

    def buckets(self, metric: LeanHistogram, arity: int = 3) -> Buckets:
        """The histogram ``metric`` bound as :meth:`tally` binds a counter."""
        bound = self._buckets.get(metric)
        if bound is None:
            bound = self._buckets[metric] = self._telemetry.child(
                metric, *self.labels[:arity]).buckets
        return bound

    def of_class(self, metric: LeanCounter, slo_class: str) -> Tally:
        """The counter ``metric`` bound to (model, pool, lever, ``slo_class``)."""
        key = (metric, slo_class)
        bound = self._by_class.get(key)
        if bound is None:
            bound = self._by_class[key] = self._telemetry.child(
                metric, *self.labels, slo_class).tally
        return bound


def _by_pool(metric: MetricWrapperBase, **only: str) -> dict[str, float]:
    """A counter's ``_total`` samples summed by their ``pool`` label, over those whose labels
    match ``only``."""
    out: dict[str, float] = {}
    for family in metric.collect():
        for sample in family.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and all(labels.get(k) == v
                                                      for k, v in only.items()):
                pool = labels["pool"]
                out[pool] = out.get(pool, 0.0) + sample.value
    return out
