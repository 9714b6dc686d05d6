"""The precise-routing run's command line and doc rewriting from saved results (no engine is
started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.launch.real_fleet import RealFleet
from config.pools import Pool
from ridge_bench.precise.benchmark import PreciseSetup, main, parser, setup_of, start_pair
from tests.unit.ridge_bench.precise.test_doc import payload


def test_the_recorded_command_repeats_the_run_without_paths() -> None:
    setup = setup_of(parser().parse_args(["--rate", "0.5", "--routers", "ridge,vllm-rr",
                                          "--out", "/somewhere"]))
    assert setup == PreciseSetup(rate=0.5, routers=("ridge", "vllm-rr"))
    assert setup.command() == ("python -m ridge_bench.precise --seed 0 --rate 0.5 "
                               "--duration 180 --requests 126 --drain 120 --blocks 24 "
                               "--routers ridge,vllm-rr")


def test_an_unknown_router_is_refused() -> None:
    with pytest.raises(SystemExit, match="unknown routers"):
        setup_of(parser().parse_args(["--routers", "ridge,nginx"]))


def test_saved_results_rewrite_the_doc(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    saved, doc = tmp_path / "results.json", tmp_path / "precise.md"
    saved.write_text(json.dumps(payload()))
    assert main(["--from-results", str(saved), "--doc", str(doc)]) == 1  # a router failed
    assert "| ridge | 19 / 20 |" in doc.read_text()
    assert "| ridge | 19 / 20 |" in capsys.readouterr().out


async def test_a_failed_engine_start_is_tried_again_on_new_ports(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tried: list[list[str]] = []

    async def start(pool: Pool, workdir: Path, timeout_s: float) -> RealFleet:
        tried.append(pool.endpoint_urls())
        if len(tried) == 1:
            raise RuntimeError("an engine exited during start-up:\nAddress already in use")
        return RealFleet()

    monkeypatch.setattr("ridge_bench.precise.benchmark.start_engines", start)
    raw, fleet, _ = await start_pair(PreciseSetup(), tmp_path)
    assert len(tried) == 2 and tried[0] != tried[1]
    assert fleet.pools[0].endpoint_urls() == raw["endpoints"] == tried[1]


async def test_engines_that_never_start_are_an_error(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    async def start(pool: Pool, workdir: Path, timeout_s: float) -> RealFleet:
        raise RuntimeError("engines not healthy")

    monkeypatch.setattr("ridge_bench.precise.benchmark.start_engines", start)
    with pytest.raises(RuntimeError, match="not healthy"):
        await start_pair(PreciseSetup(), tmp_path)
