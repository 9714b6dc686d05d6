"""The router benchmark's report of one run: figures, JSON, and plain-text tables.

A :class:`RunReport` gathers what one run measured (:mod:`ridge_bench.harness.goodput` for the
arithmetic and its definitions): the whole run's ``Summary``, one per load step, request kind
and pool; the workload's f by construction and as sent; the engines' prefix-cache hit rate and
the requests each replica finished (:mod:`ridge_bench.harness.engines`, the engines' own
counters, never a router's headers); and the client's CPU time. ``max/mean requests per
replica`` covers every endpoint both scrapes covered, unreached ones as 0 (1.0: an even
spread). See docs/benchmarks/router.md#one-runs-report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ridge_bench.harness.driver import RunData
from ridge_bench.harness.engines import FleetCacheUse
from ridge_bench.harness.goodput import RequestResult, Slo, Summary, shares, step_windows, summarise
from ridge_bench.harness.workloads import Workload


@dataclass(frozen=True)
class RunReport:
    """One run, ready to print or dump."""

    workload: str
    seed: int
    rates: tuple[float, ...]
    slo: Slo
    summary: Summary
    steps: tuple[Summary, ...]
    step_kind_pools: tuple[Mapping[str, Mapping[str, float]], ...]
    kinds: Mapping[str, Summary]
    pools: Mapping[str, Summary]
    f_theory: float
    f_sent: float
    wall_s: float
    client_cpu_s: float
    interrupted: bool
    cache: FleetCacheUse | None = None
    labels: Mapping[str, Any] = field(default_factory=dict)
    results: tuple[RequestResult, ...] = ()
    """Every request of the run (not in :func:`report_dict`: ``--requests-out`` writes them)."""


def build_report(workload: Workload, data: RunData, slo: Slo, f_theory: float,
                 cache: FleetCacheUse | None = None,
                 labels: Mapping[str, Any] | None = None) -> RunReport:
    """Summaries of ``data`` as a whole, per load step and per request kind."""
    windows = step_windows([s.duration_s for s in workload.steps], data.window_s)
    by_step: dict[int, list[RequestResult]] = defaultdict(list)
    by_kind: dict[str, list[RequestResult]] = defaultdict(list)
    by_pool: dict[str, list[RequestResult]] = defaultdict(list)
    for r in data.results:
        by_step[r.step].append(r)
        by_kind[r.kind].append(r)
        by_pool[r.route.pool or "-"].append(r)
    return RunReport(
        workload=workload.name, seed=workload.seed,
        rates=tuple(s.rate for s in workload.steps), slo=slo,
        summary=summarise(data.results, slo, data.window_s),
        steps=tuple(summarise(by_step[i], slo, w) for i, w in enumerate(windows)),
        step_kind_pools=tuple(_kind_pools(by_step[i]) for i in range(len(windows))),
        kinds={k: summarise(v, slo, data.window_s) for k, v in sorted(by_kind.items())},
        pools={k: summarise(v, slo, data.window_s) for k, v in sorted(by_pool.items())},
        f_theory=f_theory, f_sent=data.sent_prefix.f, wall_s=data.wall_s,
        client_cpu_s=data.client_cpu_s, interrupted=data.interrupted, cache=cache,
        labels=dict(labels or {}), results=tuple(data.results),
    )


def _kind_pools(results: Sequence[RequestResult]) -> dict[str, dict[str, float]]:
    """Per request kind, the share of each pool (e.g. how much chat went to ``spec``)."""
    kinds = sorted({r.kind for r in results})
    return {k: shares(r.route.pool for r in results if r.kind == k) for k in kinds}


def summary_dict(s: Summary) -> dict[str, Any]:
    """A summary's figures, derived rates included, as plain JSON values."""
    return {
        "requests": s.requests, "ok": s.ok, "good": s.good, "window_s": s.window_s,
        "goodput_rps": s.goodput, "throughput_rps": s.throughput_rps,
        "throughput_tps": s.throughput_tps, "attainment": s.attainment,
        "output_tokens": s.output_tokens, "errors": dict(s.errors),
        "ttft_p50_s": s.ttft_p50, "ttft_p99_s": s.ttft_p99,
        "tpot_p50_s": s.tpot_p50, "tpot_p99_s": s.tpot_p99,
        "e2e_p50_s": s.e2e_p50, "e2e_p99_s": s.e2e_p99,
        "pool_share": dict(s.pool_share), "lever_share": dict(s.lever_share),
        "reason_share": dict(s.reason_share),
    }


def _cache_dict(cache: FleetCacheUse | None) -> dict[str, Any] | None:
    if cache is None:
        return None
    return {
        "hit_rate": cache.total.hit_rate, "queries_tokens": cache.total.queries,
        "hits_tokens": cache.total.hits, "requests": cache.total.requests,
        "max_mean_requests_per_replica": cache.max_mean_requests,
        "missing": list(cache.missing),
        "pools": {k: {"hit_rate": v.hit_rate, "queries_tokens": v.queries, "hits_tokens": v.hits,
                      "requests": v.requests}
                  for k, v in cache.pools.items()},
        "endpoints": {k: {"queries_tokens": v.queries, "hits_tokens": v.hits,
                          "requests": v.requests, "pool": cache.endpoint_pools.get(k)}
                      for k, v in cache.endpoints.items()},
    }


def report_dict(r: RunReport) -> dict[str, Any]:
    """The whole report as plain JSON values."""
    return {
        **r.labels, "workload": r.workload, "seed": r.seed, "rates_rps": list(r.rates),
        "slo": {"ttft_s": r.slo.ttft_s, "tpot_s": r.slo.tpot_s, "e2e_s": r.slo.e2e_s},
        "summary": summary_dict(r.summary), "steps": [summary_dict(s) for s in r.steps],
        "step_kind_pools": [dict(k) for k in r.step_kind_pools],
        "kinds": {k: summary_dict(v) for k, v in r.kinds.items()},
        "pools": {k: summary_dict(v) for k, v in r.pools.items()},
        "f_theory": r.f_theory, "f_sent": r.f_sent, "wall_s": r.wall_s,
        "client_cpu_s": r.client_cpu_s, "interrupted": r.interrupted,
        "engine_prefix_cache": _cache_dict(r.cache),
    }


def _num(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def share_text(share: Mapping[str, float]) -> str:
    """``radix 62% spec 20% ...`` (largest first), ``-`` when empty."""
    return " ".join(f"{k} {v:.0%}" for k, v in share.items()) or "-"


def _row(label: str, s: Summary) -> list[str]:
    return [label, str(s.requests), str(s.good), _num(s.goodput), _num(s.throughput_rps),
            _num(s.throughput_tps, digits=0), _num(s.ttft_p50), _num(s.ttft_p99),
            _num(s.tpot_p50, 1000, 0), _num(s.tpot_p99, 1000, 0),
            str(sum(s.errors.values())), share_text(s.pool_share)]


ROW_HEADER = ["", "sent", "good", "goodput/s", "req/s", "tok/s", "TTFT p50 s", "TTFT p99 s",
              "TPOT p50 ms", "TPOT p99 ms", "errors", "pools"]


def plain_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell."""
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in (header, *rows)]
    return "\n".join(lines)


def replica_text(cache: FleetCacheUse | None) -> str | None:
    """``requests per replica (engine counters): <url> 12, <url> 8 | max/mean 1.20``, or None
    when no engine counted requests."""
    if cache is None:
        return None
    known = {url: u.requests for url, u in cache.endpoints.items() if u.requests is not None}
    if not known:
        return None
    each = ", ".join(f"{url} {n:.0f}" for url, n in known.items())
    return (f"requests per replica (engine counters): {each} | max/mean "
            f"{_num(cache.max_mean_requests)}")


def text(r: RunReport) -> str:
    """The report for a terminal: a header line, then one row for the run, per step, per kind."""
    rows = [_row("all", r.summary)]
    if len(r.steps) > 1:
        rows += [_row(f"step {i + 1} @ {rate:g}/s", s)
                 for i, (rate, s) in enumerate(zip(r.rates, r.steps, strict=True))]
    if len(r.kinds) > 1:
        rows += [_row(kind, s) for kind, s in r.kinds.items()]
    if len(r.pools) > 1:
        rows += [_row(f"pool {pool}", s) for pool, s in r.pools.items()]
    hit = r.cache.total.hit_rate if r.cache else None
    spread = r.cache.max_mean_requests if r.cache else None
    head = (f"workload {r.workload} (seed {r.seed}, rate {'/'.join(f'{x:g}' for x in r.rates)} "
            f"req/s) SLO TTFT≤{r.slo.ttft_s:g}s TPOT≤{r.slo.tpot_s * 1000:g}ms "
            f"e2e≤{r.slo.e2e_s:g}s | window {r.summary.window_s:.1f}s wall {r.wall_s:.1f}s | "
            f"f theory {r.f_theory:.2f} sent {r.f_sent:.2f} | engine prefix-cache hit rate "
            f"{_num(hit)} | max/mean requests per replica {_num(spread)} | client CPU "
            f"{r.client_cpu_s:.1f}s" + (" | INTERRUPTED" if r.interrupted else ""))
    errors = ", ".join(f"{k}: {v}" for k, v in r.summary.errors.items())
    replicas = replica_text(r.cache)
    return "\n".join([head, plain_table(ROW_HEADER, rows)]
                     + ([replicas] if replicas else [])
                     + ([f"errors: {errors}"] if errors else []))
