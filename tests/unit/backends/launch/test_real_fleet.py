from __future__ import annotations

from pathlib import Path

import pytest

from backends.launch.real_fleet import RealFleetError, engine_paths, engines_dir, start_real_fleet
from config.fleet import load_fleet, parse_fleet

ROOT = Path(__file__).resolve().parents[4]


def test_missing_set_up_names_the_script(tmp_path: Path) -> None:
    with pytest.raises(RealFleetError, match="deploy/vllm-cpu/setup.sh"):
        engine_paths(tmp_path)


async def test_only_vllm_pools_are_started(tmp_path: Path) -> None:
    (tmp_path / "vllm-venv" / "bin").mkdir(parents=True)
    (tmp_path / "vllm-venv" / "bin" / "python").touch()
    (tmp_path / "smollm2-135m").mkdir()
    (tmp_path / "smollm2-135m" / "config.json").touch()
    facts = {"params": 1, "layers": 1, "hidden_size": 1, "kv_heads": 1, "head_dim": 1,
             "dtype_bytes": 1}
    fleet = parse_fleet({"pools": [{
        "name": "r", "engine": "sglang", "models": ["m"], "endpoints": ["http://127.0.0.1:1"],
        "model": facts, "hardware": {"peak_flops": 1, "mem_bandwidth": 1}}]})
    with pytest.raises(RealFleetError, match=r"only vLLM runs on this machine; pools \['r'\]"):
        await start_real_fleet(fleet, tmp_path / "logs", root=tmp_path)


def test_the_real_demo_fleet_is_all_vllm() -> None:
    fleet = load_fleet(ROOT / "gateway" / "demo" / "demo-real-fleet.yaml")
    assert {p.engine.value for p in fleet.pools} == {"vllm"}
    assert {p.name for p in fleet.pools} == {"plain", "spec"}


def test_the_engines_directory_comes_from_the_environment_else_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RIDGE_ENGINES_DIR", raising=False)
    assert engines_dir() == Path(".engines")
    monkeypatch.setenv("RIDGE_ENGINES_DIR", str(tmp_path))
    assert engines_dir() == tmp_path
    with pytest.raises(RealFleetError, match="RIDGE_ENGINES_DIR"):
        engine_paths(engines_dir())
