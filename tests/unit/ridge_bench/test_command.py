"""``ridge bench`` options: defaults, bounds, and refusals (no network)."""

from __future__ import annotations

import pytest

from ridge_bench.command import DEFAULT_RATES, options, parser, run


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
