"""The precise-routing run's command line and doc rewriting from saved results (no engine is
started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ridge_bench.precise.benchmark import PreciseSetup, main, parser, setup_of
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
