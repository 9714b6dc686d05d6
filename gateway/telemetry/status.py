"""The fleet at a glance: the document ``/status`` serves and ``/dashboard`` draws.

:func:`sample` reads the gateway's Prometheus page (every worker's, merged) into plain numbers;
:class:`StatusHistory` keeps about one sample a second over the last ``window_s``;
:func:`status` joins the newest sample, the oldest one of the window and the registry's
snapshot. Per pool: its endpoints (health, levers declared and as the engines run them,
in-flight requests against admission control's capacity, KV use, prefix-cache hit rate), its
request and goodput rates, SLO attainment, TTFT and TPOT p50/p99, MFU and MBU, binding wall,
admission refusals; and the route decisions per pool, lever and reason. Rates, ratios and
quantiles cover the window (differences of counters and histogram buckets, quantiles
interpolated within a bucket as PromQL's ``histogram_quantile``); None where the window holds
nothing to measure. Units: seconds, requests, ratios 0–1, per-second rates.
See docs/telemetry.md#the-status-page.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from routing.snapshots import EndpointSnapshot, PoolSnapshot

Labels = tuple[tuple[str, str], ...]
Series = dict[tuple[str, Labels], float]
SCHEMA = 1
"""The document's ``schema``: raised when a field changes meaning or goes."""


@dataclass(frozen=True, slots=True)
class PageSample:
    """Every sample of one page: (sample name, sorted labels) → value; ``at`` [s, monotonic]."""

    at: float
    series: Series


def sample(page: bytes, at: float) -> PageSample:
    """The page's samples (``_created`` ones left out)."""
    series: Series = {}
    for family in text_string_to_metric_families(page.decode("utf-8", "replace")):
        for s in family.samples:
            if not s.name.endswith("_created"):
                series[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return PageSample(at, series)


class StatusHistory:
    """Samples at least ``spacing_s`` apart, the oldest kept the newest one at least
    ``window_s`` old (so a window is whole once the gateway has run that long)."""

    def __init__(self, window_s: float = 60.0, spacing_s: float = 1.0) -> None:
        self.window_s, self._spacing_s = window_s, spacing_s
        self._samples: deque[PageSample] = deque()

    def add(self, new: PageSample) -> tuple[PageSample, PageSample]:
        """Keep ``new`` (when spaced from the last); (the window's start, ``new``)."""
        if not self._samples or new.at - self._samples[-1].at >= self._spacing_s:
            self._samples.append(new)
        while len(self._samples) > 1 and new.at - self._samples[1].at >= self.window_s:
            self._samples.popleft()
        return self._samples[0], new


def total(s: PageSample, name: str, by: str = "", **match: str) -> dict[str, float]:
    """The values of ``name`` whose labels hold ``match``, summed by the label ``by`` (none:
    all of them, under the key "")."""
    out: dict[str, float] = {}
    for (sample_name, labels), value in s.series.items():
        if sample_name != name or math.isnan(value):
            continue
        d = dict(labels)
        if all(d.get(k) == v for k, v in match.items()):
            key = d.get(by, "") if by else ""
            out[key] = out.get(key, 0.0) + value
    return out


def _delta(new: PageSample, old: PageSample, name: str, **match: str) -> dict[str, float]:
    now, before = total(new, name, **match), total(old, name, **match)
    return {k: max(0.0, v - before.get(k, 0.0)) for k, v in now.items()}


def _buckets(s: PageSample, name: str, pool: str) -> dict[float, float]:
    """Cumulative counts per upper bound of histogram ``name`` in ``pool``."""
    out: dict[float, float] = {}
    for (sample_name, labels), value in s.series.items():
        d = dict(labels)
        if sample_name == name + "_bucket" and d.get("pool") == pool:
            le = float(d["le"])
            out[le] = out.get(le, 0.0) + value
    return out


def quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """The ``q`` quantile of a histogram's cumulative bucket counts (upper bound → count),
    linear within its bucket as ``histogram_quantile``; None for no observations. A quantile in
    the +Inf bucket is the highest finite bound."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank, lower, below = q * cumulative[bounds[-1]], 0.0, 0.0
    for le in bounds:
        count = cumulative[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def window_quantiles(new: PageSample, old: PageSample, name: str,
                     pool: str) -> dict[str, float | None]:
    """p50 and p99 [s] of histogram ``name`` in ``pool`` over the window."""
    now, before = _buckets(new, name, pool), _buckets(old, name, pool)
    window = {le: max(0.0, c - before.get(le, 0.0)) for le, c in now.items()}
    return {"p50": quantile(0.5, window), "p99": quantile(0.99, window)}


def _ratio(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def _gauge(s: PageSample, name: str, **labels: str) -> float | None:
    values = total(s, name, **labels)
    return values.get("") if values else None


def status(new: PageSample, old: PageSample, pools: Sequence[PoolSnapshot],
           version: str) -> dict[str, Any]:
    """The document (module docstring) for the window from ``old`` to ``new``."""
    span = new.at - old.at
    per_s = 1.0 / span if span > 0 else 0.0
    return {
        "schema": SCHEMA, "version": version, "window_s": round(span, 3),
        "pools": [_pool(new, old, p, per_s) for p in pools],
        "decisions": _labelled(new, old, "ridge_route_decisions_total",
                               ("pool", "lever", "reason"), per_s),
        "refusals": _labelled(new, old, "ridge_admission_rejected_total", ("pool", "reason"),
                              per_s),
    }


def _pool(new: PageSample, old: PageSample, pool: PoolSnapshot, per_s: float) -> dict[str, Any]:
    name = pool.name
    requests = sum(_delta(new, old, "ridge_requests_total", pool=name).values())
    good = _delta(new, old, "ridge_goodput_requests_total", pool=name).get("")
    held = _delta(new, old, "ridge_slo_evaluated_requests_total", pool=name).get("")
    refused = sum(_delta(new, old, "ridge_admission_rejected_total", pool=name).values())
    walls = total(new, "ridge_pool_binding_wall", pool=name, by="wall")
    return {
        "name": name, "engine": pool.engine, "role": pool.role, "models": list(pool.models),
        "levers": sorted(pool.levers), "levers_running": sorted(pool.offered),
        "healthy_endpoints": len(pool.healthy_endpoints), "endpoints_total": len(pool.endpoints),
        "in_flight": _gauge(new, "ridge_requests_in_flight", pool=name),
        "queued": _gauge(new, "ridge_admission_queue_depth", pool=name),
        "requests_total": sum(total(new, "ridge_requests_total", pool=name).values()),
        "requests_per_s": requests * per_s, "goodput_per_s": (good or 0.0) * per_s,
        "slo_evaluated_per_s": (held or 0.0) * per_s, "slo_attainment": _ratio(good, held),
        "refused_per_s": refused * per_s,
        "ttft_s": window_quantiles(new, old, "ridge_time_to_first_token_seconds", name),
        "tpot_s": window_quantiles(new, old, "ridge_time_per_output_token_seconds", name),
        "mfu": _by_source(new, "ridge_pool_mfu_ratio", name),
        "mbu": _by_source(new, "ridge_pool_mbu_ratio", name),
        "binding_wall": next((w for w, v in sorted(walls.items()) if v == 1.0), None),
        "endpoints": [_endpoint(new, old, name, ep) for ep in pool.endpoints],
    }


def _by_source(s: PageSample, name: str, pool: str) -> float | None:
    """The engine's own figure where it has one, else ridge's estimate."""
    values = total(s, name, pool=pool, by="source")
    return values.get("engine", values.get("ridge"))


def _endpoint(new: PageSample, old: PageSample, pool: str, ep: EndpointSnapshot) -> dict[str, Any]:
    labels = {"pool": pool, "endpoint": ep.url}
    hits = _delta(new, old, "ridge_engine_prefix_cache_hits_total", **labels).get("")
    queries = _delta(new, old, "ridge_engine_prefix_cache_queries_total", **labels).get("")
    return {
        "url": ep.url, "healthy": ep.healthy,
        "circuit_open": _gauge(new, "ridge_endpoint_circuit_open", **labels) == 1.0,
        "in_flight": _gauge(new, "ridge_endpoint_requests_in_flight", **labels),
        "capacity": _gauge(new, "ridge_endpoint_capacity_requests", **labels),
        "running": _gauge(new, "ridge_engine_requests_running", **labels),
        "waiting": _gauge(new, "ridge_engine_requests_waiting", **labels),
        "kv_usage": _gauge(new, "ridge_engine_kv_cache_usage_ratio", **labels),
        "prefix_hit_rate": _ratio(hits, queries),
        "levers_missing": sorted(ep.missing_levers),
    }


def _labelled(new: PageSample, old: PageSample, name: str, keys: tuple[str, ...],
              per_s: float) -> list[dict[str, Any]]:
    """One row per label set of counter ``name`` that counted anything: its labels, total and
    rate in the window."""
    rows = []
    for (sample_name, labels), value in sorted(new.series.items()):
        if sample_name != name:
            continue
        if value <= 0:  # a series made ready before anything happened
            continue
        d = dict(labels)
        before = old.series.get((sample_name, labels), 0.0)
        rows.append({**{k: d.get(k, "") for k in keys}, "total": value,
                     "per_s": max(0.0, value - before) * per_s})
    return rows
