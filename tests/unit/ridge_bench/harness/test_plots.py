"""The benchmarks' plots: each figure is a real PNG drawn from small fixed data, a figure with
nothing to draw writes nothing, and missing data (no hit rates, no refusals) does not crash."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ridge_bench.harness import plots
from ridge_bench.harness.goodput import RequestResult, record
from ridge_bench.harness.route import Route

PNG = b"\x89PNG\r\n\x1a\n"
SLO = {"ttft_s": 2.0, "tpot_s": 0.1, "e2e_s": 30.0}


def is_png(path: Path | None) -> bool:
    """A PNG file matplotlib drew something into (a blank 900 px figure is a few kB)."""
    assert path is not None
    data = path.read_bytes()
    return data.startswith(PNG) and len(data) > 8_000


def samples() -> list[plots.Sample]:
    out = []
    for i in range(60):
        pool = ("prefix", "spec", "chunked")[i % 3]
        if i % 10 == 9:
            out.append(plots.Sample(i * 0.5, "-", plots.REFUSED))
        elif i == 20:
            out.append(plots.Sample(i * 0.5, pool, "timeout"))
        else:
            out.append(plots.Sample(i * 0.5, pool, None, 0.05 + (i % 7) * 0.4,
                                    0.02 + (i % 5) * 0.02))
    return out


@pytest.mark.parametrize("metric", ["ttft", "tpot"])
def test_latency_over_time_and_its_cdf_are_pngs(tmp_path: Path, metric: plots.Metric) -> None:
    assert is_png(plots.latency_over_time(samples(), metric, SLO[f"{metric}_s"],
                                          tmp_path / "time.png", "agent"))
    assert is_png(plots.latency_cdf(samples(), metric, None, tmp_path / "cdf.png", "agent"))


def test_outcomes_over_time_with_and_without_refusals(tmp_path: Path) -> None:
    assert is_png(plots.outcomes_over_time(samples(), tmp_path / "a.png", "overload-on"))
    answered = [s for s in samples() if s.error is None]
    assert is_png(plots.outcomes_over_time(answered, tmp_path / "b.png", "capacity"))


def test_goodput_hit_rate_bars_and_rate_curves_are_pngs(tmp_path: Path) -> None:
    assert is_png(plots.goodput_per_pool({"prefix": 8.1, "spec": 2.0}, tmp_path / "g.png",
                                         "agent", {"prefix": 9.0, "spec": 2.5}))
    replicas = [plots.Replica(f"prefix/{i}", "prefix", 0.2 * i) for i in range(4)]
    replicas.append(plots.Replica("spec/0", "spec", None))
    assert is_png(plots.hit_rate_per_replica(replicas, tmp_path / "h.png", "agent", 0.5))
    assert is_png(plots.grouped_bars({"ridge": {"a": 200.0, "b": None}, "fastapi": {"a": 220.0}},
                                     tmp_path / "bars.png", "CPU", "µs", line=("floor", 120.0)))
    points = [plots.RatePoint("admission off", 1.0, 0.4, 0.9, 58, 0, 0, "capacity-1"),
              plots.RatePoint("admission off", 5.0, 19.3, 42.4, 306, 0, 115, "overload-off"),
              plots.RatePoint("admission on", 5.0, 0.4, 0.6, 306, 162, 0, "overload-on")]
    assert is_png(plots.ttft_against_rate(points, 1.0, tmp_path / "r.png", "overload"))
    assert is_png(plots.outcomes_per_run(points, tmp_path / "o.png", "overload"))


def test_nothing_to_draw_writes_nothing(tmp_path: Path) -> None:
    refused = [plots.Sample(0.0, "-", plots.REFUSED)]
    assert plots.latency_over_time(refused, "ttft", 2.0, tmp_path / "a.png", "x") is None
    assert plots.latency_cdf([], "tpot", 0.1, tmp_path / "b.png", "x") is None
    assert plots.outcomes_over_time([], tmp_path / "c.png", "x") is None
    assert plots.goodput_per_pool({}, tmp_path / "d.png", "x") is None
    assert plots.hit_rate_per_replica([plots.Replica("a", "p", None)], tmp_path / "e.png",
                                      "x") is None
    assert plots.grouped_bars({"a": {"s": None}}, tmp_path / "f.png", "x", "y") is None
    assert plots.ttft_against_rate([plots.RatePoint("s", 1.0, None, None)], None,
                                   tmp_path / "g.png", "x") is None
    assert plots.outcomes_per_run([], tmp_path / "h.png", "x") is None
    assert list(tmp_path.iterdir()) == []


def report(cache: dict[str, object] | None) -> dict[str, object]:
    return {"slo": SLO, "engine_prefix_cache": cache,
            "pools": {"prefix": {"goodput_rps": 8.0, "throughput_rps": 9.0},
                      "spec": {"goodput_rps": 2.0, "throughput_rps": 2.0}}}


def test_a_runs_set_from_its_report_and_records(tmp_path: Path) -> None:
    cache = {"hit_rate": 0.6, "endpoints": {
        "http://127.0.0.1:1": {"queries_tokens": 100, "hits_tokens": 80, "pool": "prefix"},
        "http://127.0.0.1:2": {"queries_tokens": 100, "hits_tokens": 40, "pool": "prefix"},
        "http://127.0.0.1:3": {"queries_tokens": 0, "hits_tokens": 0, "pool": "spec"}}}
    drawn = plots.draw_run(report(cache), samples(), tmp_path, "router-agent-ridge", "agent")
    assert sorted(p.name for p in drawn) == sorted(
        f"router-agent-ridge-{n}.png" for n in ("ttft-time", "tpot-time", "ttft-cdf",
                                                "tpot-cdf", "refusals-time", "goodput-pools",
                                                "hit-rate-replicas"))
    assert all(is_png(p) for p in drawn)
    replicas, fleet = plots.replicas_of(report(cache))
    assert [(r.label, r.hit_rate) for r in replicas] == [
        ("prefix/0", 0.8), ("prefix/1", 0.4), ("spec/0", None)]
    assert fleet == 0.6


def test_a_run_without_engine_counters_or_records_draws_what_it_has(tmp_path: Path) -> None:
    drawn = plots.draw_run(report(None), [], tmp_path, "plain:ridge", "plain")
    assert [p.name for p in drawn] == ["plain-ridge-goodput-pools.png"]
    assert plots.draw_run({}, [], tmp_path / "none", "", "x") == []


def test_samples_come_from_the_request_records(tmp_path: Path) -> None:
    results = [RequestResult("agent", 0, 1.5, None, ttft_s=0.2, e2e_s=1.2, output_tokens=11,
                             route=Route(pool="prefix")),
               RequestResult("agent", 0, 2.0, "HTTP 503", e2e_s=0.001)]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(record(r)) + "\n" for r in results))
    got = plots.read_samples(path)
    assert got[0] == plots.Sample(1.5, "prefix", None, 0.2, pytest.approx(0.1))
    assert got[1] == plots.Sample(2.0, "-", "HTTP 503", None, None)
    assert plots.read_samples(tmp_path / "absent.jsonl") == []


def test_plot_folders_and_a_missing_matplotlib(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert plots.plot_dir(None, Path("out/plots")) == Path("out/plots")
    assert plots.plot_dir("", Path("out/plots")) is None
    assert plots.plot_dir("d", Path("out/plots")) == Path("d")
    assert plots.slug("plain:ridge (2)") == "plain-ridge-2"

    def missing() -> list[Path]:
        raise plots.PlotsUnavailable("plots need matplotlib")

    assert plots.draw_or_say(missing, "ridge bench") == []
    assert "ridge bench: no plots: plots need matplotlib" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    with pytest.raises(plots.PlotsUnavailable, match="pip install matplotlib"):
        plots.goodput_per_pool({"a": 1.0}, Path("never.png"), "x")
