"""A run's report: per step and per kind, JSON, text; and the compare runner's CPU flags."""

from __future__ import annotations

import json

import pytest

from ridge_bench.compare.benchmark import saturated
from ridge_bench.compare.report import build_report, report_dict, text
from ridge_bench.harness.driver import RunData
from ridge_bench.harness.engines import CacheUse, FleetCacheUse
from ridge_bench.harness.goodput import RequestResult, Slo
from ridge_bench.harness.route import Route
from ridge_bench.harness.workloads import build

SLO = Slo(2.0, 0.1, 30.0)


def ok(kind: str, step: int, pool: str) -> RequestResult:
    return RequestResult(kind, step, 0.0, None, 0.5, 5.45, 100, route=Route(pool=pool))


def test_mixed_report_splits_steps_and_kinds() -> None:
    wl = build("mixed", 0, 6.0, 30.0, steps=3)  # steps of 10 s at 2, 4, 6 req/s
    results = [ok("chat", 0, "spec"), ok("agent", 0, "radix"),
               ok("agent", 1, "radix"), ok("rag", 1, "radix"),
               RequestResult("agent", 2, 25.0, "HTTP 503")]
    report = build_report(wl, RunData(results=results, window_s=25.0, wall_s=40.0), SLO, 0.8)
    assert [s.requests for s in report.steps] == [2, 2, 1]
    assert [s.window_s for s in report.steps] == [10.0, 10.0, 5.0]
    assert report.steps[0].pool_share == {"spec": 0.5, "radix": 0.5}
    assert report.steps[0].goodput == 0.2  # 2 good in 10 s
    assert report.step_kind_pools[0] == {"agent": {"radix": 1.0}, "chat": {"spec": 1.0}}
    assert report.summary.goodput == 4 / 25.0
    assert set(report.kinds) == {"agent", "chat", "rag"}
    assert {k: v.requests for k, v in report.pools.items()} == {"spec": 1, "radix": 3, "-": 1}
    assert report.rates == (2.0, 4.0, 6.0)
    body = json.loads(json.dumps(report_dict(report)))
    assert body["steps"][2]["errors"] == {"HTTP 503": 1}
    shown = text(report)
    assert "step 3 @ 6/s" in shown and "errors: HTTP 503: 1" in shown


def test_requests_per_replica_in_json_and_text() -> None:
    wl = build("mixed", 0, 6.0, 30.0, steps=1)
    ends = {"http://a:1": CacheUse(100, 40, 12), "http://b:1": CacheUse(80, 20, 8),
            "http://c:1": CacheUse(0, 0, 0), "http://d:1": CacheUse(0, 0, None)}
    cache = FleetCacheUse(total=CacheUse(180, 60, 20),
                          pools={"radix": CacheUse(180, 60, 20), "spec": CacheUse(0, 0, 0)},
                          missing=("http://e:1",), endpoints=ends)
    report = build_report(wl, RunData(results=[ok("chat", 0, "radix")], window_s=30.0,
                                      wall_s=31.0), SLO, 0.8, cache=cache)
    body = json.loads(json.dumps(report_dict(report)))["engine_prefix_cache"]
    # a 12, b 8, c 0 (d's engine does not count, e was not scraped): mean 20/3, max 12 -> 1.8
    assert body["max_mean_requests_per_replica"] == pytest.approx(1.8)
    assert body["requests"] == 20
    assert body["pools"]["spec"]["requests"] == 0
    assert {k: v["requests"] for k, v in body["endpoints"].items()} == {
        "http://a:1": 12, "http://b:1": 8, "http://c:1": 0, "http://d:1": None}
    shown = text(report)
    assert "max/mean requests per replica 1.80" in shown
    assert ("requests per replica (engine counters): http://a:1 12, http://b:1 8, "
            "http://c:1 0 | max/mean 1.80") in shown


def test_no_engine_counters_no_replica_figures() -> None:
    wl = build("mixed", 0, 6.0, 30.0, steps=1)
    report = build_report(wl, RunData(results=[ok("chat", 0, "radix")], window_s=30.0,
                                      wall_s=31.0), SLO, 0.8)
    assert report_dict(report)["engine_prefix_cache"] is None
    shown = text(report)
    assert "max/mean requests per replica -" in shown and "engine counters" not in shown


def test_processes_over_most_of_a_core_are_flagged() -> None:
    cpu = {"wall_s": 10.0, "machine": {"cpu_s": 19.0, "core_pct": 190.0},
           "sim": {"cpu_s": 9.0, "core_pct": 90.0}, "ridge": {"cpu_s": 2.0, "core_pct": 20.0}}
    assert saturated(cpu, client_cpu_s=1.0) == ["sim"]
    assert saturated(cpu, client_cpu_s=8.5) == ["sim", "client"]
