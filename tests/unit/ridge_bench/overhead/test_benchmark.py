"""The overhead benchmark's arithmetic: windows, medians over rounds, added TTFT, rotation;
which routers a run installs or skips; its plots from saved results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ridge_bench.harness import gateways, plots
from ridge_bench.harness.gateways import BY_KEY, RustRouter
from ridge_bench.overhead import doc as overhead_doc
from ridge_bench.overhead.benchmark import (
    DIRECT,
    Window,
    body,
    draw_plots,
    main,
    parser,
    percentile,
    portable_command,
    rotated,
    setup_from,
    summary,
)


def test_bodies() -> None:
    assert "stream" not in json.loads(body("m", stream=False))
    streamed = json.loads(body("m", stream=True))
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}


def test_cpu_is_per_request_or_per_relayed_event() -> None:
    plain = Window(0, "ridge", "json32", ok=900, errors=103, error_kinds={"non-200": 100},
                   wall_s=2.0, gateway_cpu_s=0.5)  # 3 socket errors: not answered
    assert plain.figures()["cpu_us"] == 500.0 and plain.figures()["rps"] == 450.0
    assert plain.figures()["gateway_core_pct"] == 25.0
    streamed = Window(0, "ridge", "paced32", ok=10, events=220, wall_s=1.0, gateway_cpu_s=0.011)
    assert streamed.figures()["cpu_us"] == pytest.approx(50.0)
    direct = Window(0, "direct", "json32", ok=5, wall_s=1.0)
    assert direct.figures()["cpu_us"] is None


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile(list(map(float, range(1, 101))), 99) == 99.0


def test_summary_takes_medians_sums_errors_and_subtracts_direct_ttft_per_round() -> None:
    windows = []
    for r, (cpu, ttft, base) in enumerate([(0.3, 30.0, 21.0), (0.1, 25.0, 22.0),
                                            (0.2, 40.0, 20.0)]):
        windows.append(Window(r, "ridge", "json32", ok=1000 - r, errors=r,
                              error_kinds={"non-200": r}, wall_s=1.0, gateway_cpu_s=cpu))
        windows.append(Window(r, "ridge", "paced32", ok=10, wall_s=1.0, events=100,
                              ttft_p50_ms=ttft, ttft_p99_ms=ttft + 10))
        windows.append(Window(r, "direct", "paced32", ok=10, wall_s=1.0, events=100,
                              ttft_p50_ms=base, ttft_p99_ms=base + 1))
    s = summary(windows)
    assert s["ridge"]["json32"]["cpu_us"] == pytest.approx(200.0)
    assert s["ridge"]["json32"]["errors"] == 3 and s["ridge"]["json32"]["rounds"] == 3
    assert s["ridge"]["paced32"]["added_ttft_p50_ms"] == pytest.approx(9.0)  # 9, 3, 20
    assert s["ridge"]["paced32"]["added_ttft_p99_ms"] == pytest.approx(18.0)
    assert s["direct"]["paced32"]["added_ttft_p50_ms"] == 0.0


def test_rounds_rotate_the_order() -> None:
    targets = (DIRECT, BY_KEY["ridge"], BY_KEY["fastapi"])
    assert [g.key for g in rotated(targets, 1)] == ["ridge", "fastapi", "direct"]
    assert rotated(targets, 3) == list(targets)


def test_the_shown_command_has_no_paths_of_this_machine() -> None:
    argv = ["--rounds", "1", "--ridge-src", "/tmp/x", "--out=/o", "--doc", "d.md", "--section",
            "before"]
    assert portable_command(argv) == ("python -m ridge_bench.overhead --rounds 1 "
                                      "--ridge-src DIR --section before")


def test_plan_without_the_sglang_router(tmp_path: object) -> None:
    notes: list[str] = []
    args = parser().parse_args(["--gateways", "ridge,aiohttp", "--rounds", "2"])
    setup, launch = setup_from(args, notes)
    assert [g.key for g in setup.targets] == ["direct", "ridge", "aiohttp"]
    assert setup.rounds == 2 and launch.sglang_python is None and len(notes) == 1
    with pytest.raises(ValueError, match="unknown"):
        setup_from(parser().parse_args(["--gateways", "nginx"]), [])


def test_from_results_draws_the_bars_without_the_direct_runs(tmp_path: Path) -> None:
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps({"summary": {
        "direct": {"json32": {"rps": 50_000.0, "cpu_us": None}},
        "ridge": {"json32": {"rps": 5_000.0, "cpu_us": 200.0},
                  "json256": {"rps": 4_500.0, "cpu_us": 220.0},
                  "burst32": {"rps": 3_300.0, "cpu_us": 14.0},
                  "paced32": {"rps": 300.0, "cpu_us": 35.0}},
        "fastapi": {"json32": {"rps": 4_500.0, "cpu_us": 220.0}}}}))
    assert main(["--from-results", str(saved), "--doc", "", "--plots", str(tmp_path / "p")]) == 0
    names = sorted(p.name for p in (tmp_path / "p").iterdir())
    assert names == ["overhead-current-cpu-chunk.png", "overhead-current-cpu-request.png",
                     "overhead-current-rps.png"]
    assert main(["--from-results", str(saved), "--doc", "", "--section", "before"]) == 0
    assert (tmp_path / "plots" / "overhead-before-rps.png").is_file()  # beside the results
    assert draw_plots({"summary": {}}, "x", tmp_path / "none") == []


def test_the_default_run_has_every_router_and_each_is_installed_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, bool, str]] = []

    def fake(router: RustRouter, install: bool, log: Path) -> tuple[Path | None, str]:
        asked.append((router.kind, install, log.name))
        if router.kind == "smg":
            return None, "not installed in .bench-venv/ (and --no-install)"
        return tmp_path / "python", ""

    monkeypatch.setattr(gateways, "router_python", fake)
    notes: list[str] = []
    args = parser().parse_args(["--no-install", "--out", str(tmp_path)])
    setup, launch = setup_from(args, notes)
    assert asked == [("sglang", False, "sglang-install.log"), ("smg", False, "smg-install.log"),
                     ("vllm-router", False, "vllm-router-install.log")]
    keys = [g.key for g in setup.targets]
    assert keys == ["direct", "ridge", "fastapi", "aiohttp", "ridge-floor", "sglang-rr",
                    "sglang-ca", "vllm-rr", "vllm-ca"]  # smg's rows left out, with a note
    assert notes[0] == "smg skipped: not installed in .bench-venv/ (and --no-install)"
    assert launch.smg_python is None and launch.vllm_router_python == tmp_path / "python"
    assert launch.sglang_python == tmp_path / "python"
    assert "smg-rr" in parser().parse_args([]).gateways  # all run by default


def test_the_plots_and_the_doc_put_the_routers_first(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    drawn: list[list[str]] = []

    def bars(values: dict[str, Any], path: Path, *args: Any, **kwargs: Any) -> Path:
        drawn.append(list(values))
        return path

    monkeypatch.setattr(plots, "grouped_bars", bars)
    cell = {"cpu_us": 100.0, "rps": 1000.0}
    keys = ["ridge", "vllm-ca", "smg-rr", "direct", "aiohttp", "smg-ca", "vllm-rr", "other"]
    draw_plots({"summary": {k: {s: dict(cell) for s in ("json32", "paced32")} for k in keys}},
               "x", tmp_path)
    assert drawn[0] == ["smg-rr", "smg-ca", "vllm-rr", "vllm-ca", "aiohttp", "ridge", "other"]
    assert all(g.key in overhead_doc.ORDER for g in gateways.GATEWAYS)
