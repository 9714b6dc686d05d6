"""The overload benchmark's arithmetic, plumbing and plots (the runs themselves are a
measurement)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from config.fleet import load_fleet
from ridge_bench import command
from ridge_bench.harness.goodput import RequestResult, Slo, write_records
from ridge_bench.overload import benchmark as overload
from routing.snapshots import EngineMetrics

SLO = Slo(1.0, 0.2, 60.0)


def ok(ttft: float) -> RequestResult:
    return RequestResult("chat", 0, 0.0, None, ttft_s=ttft, e2e_s=5.0, output_tokens=100)


def refused(ms: float) -> RequestResult:
    return RequestResult("chat", 0, 0.0, "HTTP 503", e2e_s=ms / 1e3)


def test_a_row_splits_admitted_refused_and_failed_and_times_the_refusals() -> None:
    results = [ok(0.4), ok(0.6), ok(1.5), refused(1.0), refused(3.0),
               RequestResult("chat", 0, 0.0, "unfinished")]
    run = overload.row("overload-on", True, 4.0, results, SLO, window_s=2.0)
    assert (run.sent, run.admitted, run.refused, run.failed) == (6, 3, 2, 1)
    assert run.ttft_p50 == 0.6 and run.ttft_p99 == 1.5
    assert run.refusal_p50_ms == pytest.approx(1.0) and run.refusal_p99_ms == pytest.approx(3.0)
    assert run.goodput == 1.0  # two good requests in a 2 s window
    assert not overload.within_slo(run, SLO)


def test_the_capacity_is_a_run_with_every_request_answered_within_the_slo() -> None:
    good = overload.row("capacity-1", False, 1.0, [ok(0.4), ok(0.9)], SLO, 2.0)
    late = overload.row("capacity-2", False, 2.0, [ok(0.4), ok(1.2)], SLO, 2.0)
    assert overload.within_slo(good, SLO) and not overload.within_slo(late, SLO)
    assert "| capacity-2 | off | 2 | 2 | 2 | 0 | 0 | 0.40 / 1.20 |" in overload.line(late, good)
    assert overload.line(late, good).endswith("| 50 % | –, – |")


def test_the_fleet_is_rendered_on_free_ports_with_its_slo_in_wall_clock_time(
        tmp_path: Path) -> None:
    setup = overload.OverloadSetup(speed=4.0)
    slo = overload.render(setup, tmp_path / "fleet.yaml")
    assert slo == Slo(0.25, 0.05, 15.0)
    fleet = load_fleet(tmp_path / "fleet.yaml")
    assert len(fleet.pools) == 1 and len(fleet.pools[0].endpoints) == 2
    raw = yaml.safe_load((tmp_path / "fleet.yaml").read_text())
    assert raw["slos"]["*"]["ttft_s"] == 0.25
    assert all(":183" not in u for u in fleet.pools[0].endpoint_urls())  # moved to free ports


def test_the_workload_is_unique_long_prompts_at_the_rate() -> None:
    work = overload.workload(overload.OverloadSetup(duration_s=10.0), 3.0)
    arrivals = work.arrivals(1000)
    assert 10 < len(arrivals) < 60 and all(a.at_s < 10.0 for a in arrivals)
    conv = work.sources["chat"].conversation(0)
    assert len(conv.turns) == 1 and 64 <= conv.turns[0].max_tokens <= 192


def test_bad_options_exit_2_through_ridge_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.run(["overload", "--rates", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err
    setup = overload.setup_of(overload.parser().parse_args(
        ["--rates", "1,2", "--prompt-tokens", "100-200", "--max-tokens", "50"]))
    assert setup.rates == (1.0, 2.0) and setup.prompt_tokens == (100, 200)
    assert setup.max_tokens == (50, 50)


def test_the_refusals_split_into_at_once_and_after_waiting_and_the_engines_are_averaged(
) -> None:
    run = overload.row("overload-on", True, 4.0, [ok(0.4), refused(1.0), refused(2.0),
                                                  refused(900.0)], SLO, 1.0)
    run = overload.Run(**{**run.__dict__, "refused_after_wait": 1, "engine_waiting": 0.25,
                          "engine_kv": 0.875})
    assert "| 1 | 2 + 1 | 0 |" in overload.line(run, None)
    assert overload.line(run, None).endswith("| – | 0.2, 88 % |")
    watch = overload.Watch(load_fleet(overload.FLEET))
    a, b = (EngineMetrics(running=10, waiting=w, kv_cache_usage=kv)
            for w, kv in ((0.0, 0.8), (2.0, 1.0)))
    watch.readings = [(0.0, {"x": a, "y": b}), (2.0, {"x": b}), (99.0, {"x": b})]
    assert watch.means(60.0) == (pytest.approx(4 / 3), pytest.approx(2.8 / 3))


def test_the_plots_are_drawn_from_the_saved_runs_and_their_records(tmp_path: Path) -> None:
    records = tmp_path / "overload-on" / "requests.jsonl"
    records.parent.mkdir()
    write_records(records, [ok(0.4), ok(0.5), refused(1.0)])
    runs = [overload.row("capacity-1", False, 1.0, [ok(0.4), ok(0.9)], SLO, 2.0),
            overload.row("overload-off", False, 4.0, [ok(3.0), ok(9.0)], SLO, 2.0),
            overload.Run(**{**overload.row("overload-on", True, 4.0, [ok(0.4), refused(1.0)],
                                           SLO, 2.0).__dict__,
                            "requests_file": str(records)})]
    saved = tmp_path / "overload.json"
    saved.write_text(json.dumps({"plan": {}, "capacity": "capacity-1", "slo": asdict(SLO),
                                 "runs": [asdict(r) for r in runs]}))
    assert overload.main(["--from-results", str(saved), "--plots", str(tmp_path / "p")]) == 0
    names = {p.name for p in (tmp_path / "p").iterdir()}
    assert {"overload-ttft-rate.png", "overload-outcomes.png", "overload-on-ttft-time.png",
            "overload-on-refusals-time.png"} <= names
    assert not any("capacity-1-" in n for n in names)  # no records kept for it


def test_a_saved_file_without_its_slo_takes_the_fleet_files(tmp_path: Path) -> None:
    saved = tmp_path / "overload.json"
    saved.write_text(json.dumps({"plan": {"fleet": str(overload.FLEET), "speed": "2.0"},
                                 "capacity": None, "runs": []}))
    runs, capacity, slo = overload.saved(saved)
    assert (runs, capacity, slo) == ([], None, Slo(0.5, 0.1, 30.0))
