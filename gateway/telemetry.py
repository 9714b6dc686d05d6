"""ridge's own Prometheus metrics, on a registry the app is given (never the global one).

Names follow Prometheus conventions: ``ridge_`` prefix, base units (seconds), ``_total`` only on
counters, histograms rather than averaged gauges. Label values are bounded: ``model`` is one of
the fleet's configured model names (anything else is reported as ``other``), ``pool`` one of
its pools (``none`` before a pool was chosen), ``status`` an HTTP status code.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Buckets for LLM latencies, seconds. TTFT spans cached short prompts (~10 ms) to queued long
# prefills (a minute); TPOT a fast GPU decode step (~5 ms) to a saturated CPU (~1 s).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 30, 60)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.5, 0.75, 1.0, 2.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300,
               600)

OTHER_MODEL = "other"
NO_POOL = "none"


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request, as telemetry records it. Times in seconds; None = not measured."""

    model: str
    pool: str
    status: int
    e2e_s: float
    ttft_s: float | None = None
    completion_tokens: int | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (e2e − TTFT) / (tokens − 1), seconds."""
        if self.ttft_s is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


class Telemetry:
    """The gateway's metrics; one instance per app, on an injected registry."""

    def __init__(self, registry: CollectorRegistry, models: frozenset[str]) -> None:
        self.registry = registry
        self._models = models
        labels = ("model", "pool")
        self.requests = Counter(
            "ridge_requests", "Requests finished, by HTTP status",
            ("model", "pool", "status"), registry=registry,
        )
        self.e2e = Histogram(
            "ridge_request_duration_seconds", "End-to-end request latency",
            labels, buckets=E2E_BUCKETS, registry=registry,
        )
        self.ttft = Histogram(
            "ridge_time_to_first_token_seconds", "Time to the first generated token",
            labels, buckets=TTFT_BUCKETS, registry=registry,
        )
        self.tpot = Histogram(
            "ridge_time_per_output_token_seconds", "Mean time per output token after the first",
            labels, buckets=TPOT_BUCKETS, registry=registry,
        )
        self.in_flight = Gauge(
            "ridge_requests_in_flight", "Requests being served now", ("pool",), registry=registry,
        )
        self.retries = Counter(
            "ridge_upstream_retries", "Requests retried on another endpoint", ("pool",),
            registry=registry,
        )

    def model_label(self, model: str | None) -> str:
        return model if model in self._models else OTHER_MODEL

    def record(self, rec: RequestRecord) -> None:
        model = self.model_label(rec.model)
        self.requests.labels(model, rec.pool, str(rec.status)).inc()
        if rec.pool == NO_POOL:
            return
        self.e2e.labels(model, rec.pool).observe(rec.e2e_s)
        if rec.ttft_s is not None:
            self.ttft.labels(model, rec.pool).observe(rec.ttft_s)
        tpot = rec.tpot_s
        if tpot is not None:
            self.tpot.labels(model, rec.pool).observe(tpot)
