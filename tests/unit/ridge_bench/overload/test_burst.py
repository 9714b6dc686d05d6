"""The burst benchmark's schedule, its figures per pool and its runs (no run here: those are
measurements, docs/benchmarks/overload.md)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from ridge_bench.harness.goodput import RequestResult, Slo, write_records
from ridge_bench.harness.route import Route
from ridge_bench.overload.burst import (
    BurstRun,
    BurstSetup,
    burst_times,
    draw_plots,
    lines,
    parser,
    plan_runs,
    pool_row,
    rows_by_pool,
    saved,
    setup_of,
    span,
    workload,
)

SLO = Slo(1.0, 0.1, 30.0)


def test_a_cold_burst_arrives_at_once_and_a_ramp_evenly() -> None:
    assert burst_times(3, 0.0) == (0.0, 0.0, 0.0)
    assert burst_times(4, 10.0) == (0.0, 2.5, 5.0, 7.5)


def test_the_workload_sends_at_the_given_times_with_unique_prompts() -> None:
    w = workload(BurstSetup(), 0, 10.0, (0.0, 5.0))
    assert [a.at_s for a in w.arrivals(10)] == [0.0, 5.0]
    first, second = (w.sources["chat"].conversation(i).turns[0] for i in range(2))
    assert first.content != second.content and first.max_tokens == 300


def _result(pool: str | None, error: str | None, ttft: float | None, sent: float = 0.0,
            e2e: float = 2.0) -> RequestResult:
    return RequestResult("chat", 0, sent, error, ttft_s=ttft, e2e_s=e2e, output_tokens=30,
                         route=Route(pool=pool))


def test_a_pool_row_counts_admitted_refused_and_failed_and_its_slo() -> None:
    results = [_result("a", None, 0.4), _result("a", None, 1.5), _result("a", "HTTP 503", None,
                                                                          e2e=0.002),
               _result("a", "unfinished", None, e2e=None)]
    row = pool_row("a", results, SLO, span_s=10.0)
    assert (row.sent, row.admitted, row.refused, row.failed) == (4, 2, 1, 1)
    assert row.within_ttft == 0.5 and row.refusal_p50_ms == pytest.approx(2.0)
    assert row.goodput == pytest.approx(0.1)  # only the first meets every bound


def test_rows_go_by_the_pool_the_route_header_names() -> None:
    rows = rows_by_pool([_result("b", None, 0.2), _result(None, "HTTP 503", None),
                         _result("a", None, 0.3)], SLO, 1.0)
    assert [r.pool for r in rows] == ["a", "b", "none"]


def test_the_span_runs_to_the_last_end() -> None:
    assert span([_result("a", None, 0.1, sent=1.0, e2e=2.0), _result("a", None, 0.1, sent=4.0,
                                                                     e2e=0.5)]) == 4.5
    assert span([]) == 0.0


def test_every_seed_and_ramp_runs_the_baseline_then_each_gateway_count() -> None:
    runs = list(plan_runs(BurstSetup(seeds=(0,), ramps_s=(0.0, 10.0), gateways=(1, 2))))
    assert runs == [(0, 0.0, False, 1), (0, 0.0, True, 1), (0, 0.0, True, 2),
                    (0, 10.0, False, 1), (0, 10.0, True, 1), (0, 10.0, True, 2)]
    assert all(admission for _, _, admission, _ in
               plan_runs(BurstSetup(seeds=(0,), baseline=False)))


def test_a_run_prints_the_fleets_row_then_each_pools() -> None:
    results = [_result("a", None, 0.4)]
    run = BurstRun("seed0", 0, 0.0, True, 1, 5.0, pool_row("*", results, SLO, 5.0),
                   rows_by_pool(results, SLO, 5.0))
    assert [line.split(" | ")[1] for line in lines(run)] == ["*", "a"]


def test_the_command_line_gives_the_setup_and_refuses_what_cannot_run() -> None:
    setup = setup_of(parser().parse_args(["--ramps", "0,5", "--seeds", "1", "--no-baseline"]))
    assert (setup.ramps_s, setup.seeds, setup.baseline) == ((0.0, 5.0), (1,), False)
    with pytest.raises(ValueError, match="positive"):
        setup_of(parser().parse_args(["--requests", "0"]))


def test_the_overload_command_hands_burst_on(capsys: pytest.CaptureFixture[str]) -> None:
    from ridge_bench.overload.benchmark import main

    assert main(["burst", "--requests", "0"]) == 2
    assert "ridge bench overload burst: --requests" in capsys.readouterr().err


def test_saved_runs_redraw_their_plots_without_a_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = [_result("a", None, 0.4, sent=0.1), _result("b", None, 0.6, sent=0.2),
               _result("b", "HTTP 503", None, sent=0.3, e2e=0.002)]
    (tmp_path / "seed0").mkdir()
    write_records(tmp_path / "seed0" / "requests.jsonl", results)
    run = BurstRun("seed0", 0, 0.0, True, 1, 2.0, pool_row("*", results, SLO, 2.0),
                   rows_by_pool(results, SLO, 2.0), {"ttft_s": 1.0, "tpot_s": 0.1})
    saved_file = tmp_path / "runs.json"
    saved_file.write_text(json.dumps([asdict(run)]))
    again = saved(saved_file, tmp_path)
    assert again[0].pools == run.pools and again[0].requests_file.endswith("requests.jsonl")
    drawn = draw_plots(again, tmp_path)
    names = {p.name for p in drawn}
    assert {"burst-ttft-p99.png", "burst-seed0-ttft-cdf.png",
            "burst-seed0-goodput-pools.png"} <= names
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in drawn)
