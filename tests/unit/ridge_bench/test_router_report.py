"""A run's report: per step and per kind, JSON, text; and the compare runner's CPU flags."""

from __future__ import annotations

import json

from ridge_bench.compare import saturated
from ridge_bench.driver import RunData
from ridge_bench.goodput import RequestResult, Slo
from ridge_bench.route import Route
from ridge_bench.router_report import build_report, report_dict, text
from ridge_bench.workloads import build

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


def test_processes_over_most_of_a_core_are_flagged() -> None:
    cpu = {"wall_s": 10.0, "machine": {"cpu_s": 19.0, "core_pct": 190.0},
           "sim": {"cpu_s": 9.0, "core_pct": 90.0}, "ridge": {"cpu_s": 2.0, "core_pct": 20.0}}
    assert saturated(cpu, client_cpu_s=1.0) == ["sim"]
    assert saturated(cpu, client_cpu_s=8.5) == ["sim", "client"]
