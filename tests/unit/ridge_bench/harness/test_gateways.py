"""The gateways under test: ridge's fleet file and each gateway's command (nothing started)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from config.fleet import parse_fleet
from ridge_bench.harness.gateways import BY_KEY, GATEWAYS, Launch, command, fleet
from ridge_bench.harness.procs import ROOT
from ridge_bench.harness.upstream import MODEL, PACED_MODEL

URLS = [f"http://127.0.0.1:{19000 + i}" for i in range(8)]


def test_ridge_fleet_is_valid_and_serves_both_models() -> None:
    parsed = parse_fleet(fleet(URLS))
    (pool,) = parsed.pools
    assert [str(e).rstrip("/") for e in pool.endpoints] == URLS
    assert set(pool.models) == {MODEL, PACED_MODEL}
    assert "routing" not in fleet(URLS)  # every routing setting stays default


def test_installed_ridge_serves_the_rendered_fleet(tmp_path: Path) -> None:
    argv, env, cwd = command(BY_KEY["ridge"], Launch(), 8123, URLS, tmp_path)
    assert argv[-5:] == ["serve", "--config", str(tmp_path / "fleet.yaml"), "--port", "8123"]
    assert env == {} and cwd == ROOT
    assert yaml.safe_load((tmp_path / "fleet.yaml").read_text()) == fleet(URLS)


def test_ridge_from_another_source_tree_runs_there(tmp_path: Path) -> None:
    src = tmp_path / "old"
    argv, env, cwd = command(BY_KEY["ridge"], Launch(ridge_src=src), 1, URLS, tmp_path)
    assert argv[:3] == [sys.executable, "-m", "gateway.cli"]  # as older trees run it too
    assert env == {"PYTHONPATH": str(src)} and cwd == src


def test_ridge_with_the_aiohttp_transport_is_told_so(tmp_path: Path) -> None:
    argv, env, _ = command(BY_KEY["ridge-aiohttp"], Launch(), 8123, URLS, tmp_path)
    assert argv[-5:] == ["serve", "--config", str(tmp_path / "fleet.yaml"), "--port", "8123"]
    assert env == {"RIDGE_UPSTREAM__TRANSPORT": "aiohttp"}
    assert "ridge-aiohttp" not in {g.key for g in GATEWAYS}  # run only when asked for


def test_floors_and_the_sglang_router(tmp_path: Path) -> None:
    argv, _, _ = command(BY_KEY["aiohttp"], Launch(), 7, URLS, tmp_path)
    assert argv[2:6] == ["ridge_bench.overhead.passthrough", "--server", "aiohttp", "--port"]
    assert argv[-8:] == URLS
    with pytest.raises(RuntimeError, match="not installed"):
        command(BY_KEY["sglang-ca"], Launch(), 7, URLS, tmp_path)
    python = tmp_path / "python"
    argv, env, _ = command(BY_KEY["sglang-ca"], Launch(sglang_python=python), 7, URLS, tmp_path)
    assert argv[:3] == [str(python), "-m", "sglang_router.launch_router"]
    assert argv[argv.index("--policy") + 1] == "cache_aware" and env == {"PYTHONPATH": ""}


def test_every_gateway_has_a_unique_key() -> None:
    assert len({g.key for g in GATEWAYS}) == len(GATEWAYS)
