"""Loading the fleet file's tokenizers once for the gateway and the simulator
(backends.engines.tokenizers)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from backends.engines.tokenizers import fleet_tokenizers, pool_tokenizer
from config.fleet import FleetConfigError, parse_fleet

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from tests.fakes.tiny_model import model_folder  # noqa: E402 - needs the tokenizers package

FACTS = {"params": 1e9, "layers": 2, "hidden_size": 8, "kv_heads": 1, "head_dim": 8,
         "dtype_bytes": 2}


def fleet(tokenizers: dict[str, Any]) -> Any:
    pools = [{"name": "a", "engine": "vllm", "models": ["m", "m-alias"],
              "endpoints": ["http://h:1"], "model": FACTS},
             {"name": "b", "engine": "vllm", "models": ["n"], "endpoints": ["http://h:2"],
              "model": FACTS}]
    return parse_fleet({"pools": pools, "routing": {"features": {"tokenizers": tokenizers}}})


def test_each_model_is_logged_once_exact_or_estimated(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    folder = model_folder(tmp_path / "m")
    with caplog.at_level(logging.INFO, logger="backends.engines.tokenizers"):
        loaded = fleet_tokenizers(fleet({"m-alias": str(folder)}))
    assert set(loaded) == {"m-alias"}
    lines = [r.getMessage() for r in caplog.records]  # the fleet's order of models
    assert [line.split(":")[0] for line in lines] == [
        "prompt tokens of m", "prompt tokens of m-alias", "prompt tokens of n"]
    assert "m-alias: exact (" in lines[1] and "content format string" in lines[1]
    assert lines[0].endswith("estimated (4 characters a token)")


def test_without_any_tokenizer_one_line_says_every_model_is_estimated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="backends.engines.tokenizers"):
        assert fleet_tokenizers(fleet({})) == {}
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "prompt tokens of every model: estimated"]


def test_a_pool_takes_the_tokenizer_of_its_first_model_that_has_one(tmp_path: Path) -> None:
    f = fleet({"m-alias": str(model_folder(tmp_path / "m"))})
    loaded = fleet_tokenizers(f, report=False)
    assert pool_tokenizer(f.pools[0], loaded) is loaded["m-alias"]
    assert pool_tokenizer(f.pools[1], loaded) is None


def test_a_missing_required_tokenizer_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(FleetConfigError, match=r"routing.features.tokenizers.m: cannot load "):
        fleet_tokenizers(fleet({"m": str(tmp_path / "nowhere")}))


def test_a_missing_optional_tokenizer_is_estimated_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="backends.engines.tokenizers"):
        loaded = fleet_tokenizers(fleet({"m": {"path": str(tmp_path / "x"), "required": False}}))
    assert loaded == {}
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "cannot load" in warning.getMessage() and "estimated" in warning.getMessage()


def test_without_the_tokenizers_package_start_up_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = model_folder(tmp_path / "m")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    monkeypatch.setattr("backends.engines.tokenizers.tokenizers_available", lambda: False)
    with pytest.raises(FleetConfigError, match=r"ridge\[tokenizers\]"):
        fleet_tokenizers(fleet({"m": str(folder)}))
