"""``ridge bench`` options: defaults, bounds, refusals, and its plots (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ridge_bench import command
from ridge_bench.command import DEFAULT_RATES, options, parser, run
from ridge_bench.compare.report import RunReport, build_report
from ridge_bench.harness.driver import RunData
from ridge_bench.harness.engines import CacheUse, FleetCacheUse
from ridge_bench.harness.goodput import RequestResult, Slo
from ridge_bench.harness.route import Route
from ridge_bench.harness.workloads import build


def test_defaults_bound_the_run_and_drain_for_the_e2e_slo() -> None:
    opts = options(parser().parse_args(["--workload", "agent"]))
    assert (opts.requests, opts.duration_s) == (400, 60.0)
    assert opts.rate == DEFAULT_RATES["agent"]
    assert (opts.slo.ttft_s, opts.slo.tpot_s, opts.slo.e2e_s) == (2.0, 0.1, 30.0)
    assert opts.drain_s == 30.0 and opts.ignore_eos and opts.fleet is None


def test_flags_override() -> None:
    opts = options(parser().parse_args([
        "--workload", "mixed", "--url", "http://h:1/", "--rate", "9", "--steps", "4",
        "--requests", "50", "--duration", "20", "--slo-e2e", "12", "--no-ignore-eos"]))
    assert opts.url == "http://h:1" and opts.rate == 9.0 and opts.steps == 4
    assert opts.drain_s == 12.0 and not opts.ignore_eos


@pytest.mark.parametrize("argv", [["--requests", "0"], ["--duration", "0"], ["--steps", "0"]])
def test_impossible_bounds_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--workload", "chat", *argv]) == 2
    assert "ridge bench:" in capsys.readouterr().err


def test_an_unknown_workload_is_refused() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--workload", "batch"])


def test_a_bad_fleet_file_exits_2(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--workload", "chat", "--fleet", "/nonexistent/fleet.yaml"]) == 2
    assert "cannot read" in capsys.readouterr().err


def _report() -> RunReport:
    results = [RequestResult("agent", 0, i * 0.1, None if i % 5 else "HTTP 503",
                             ttft_s=0.3 + i * 0.01, e2e_s=2.0 + i * 0.01, output_tokens=20,
                             route=Route(pool="prefix" if i % 2 else "spec"))
               for i in range(40)]
    cache = FleetCacheUse(CacheUse(200, 120), {"prefix": CacheUse(200, 120)},
                          endpoints={"http://127.0.0.1:1": CacheUse(200, 120)},
                          endpoint_pools={"http://127.0.0.1:1": "prefix"})
    return build_report(build("agent", 0, 10.0, 4.0), RunData(results, 4.0, 6.0),
                        Slo(2.0, 0.1, 30.0), 0.8, cache)


def test_plots_go_to_the_plots_folder_named_after_the_workload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_main(opts: object) -> RunReport:
        return _report()

    monkeypatch.setattr(command, "_main", fake_main)
    assert run(["--workload", "agent", "--plots", str(tmp_path), "--no-progress"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"agent-{n}.png" for n in (
        "ttft-time", "tpot-time", "ttft-cdf", "tpot-cdf", "refusals-time", "goodput-pools",
        "hit-rate-replicas"))
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in tmp_path.iterdir())


def test_no_plots_without_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[object] = []

    async def fake_main(opts: object) -> RunReport:
        return _report()

    monkeypatch.setattr(command, "_main", fake_main)
    monkeypatch.setattr(command, "draw_plots", lambda *a: drawn.append(a) or [])
    assert run(["--workload", "agent", "--json", str(tmp_path / "r.json")]) == 0
    assert drawn == [] and [p.name for p in tmp_path.iterdir()] == ["r.json"]
