from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backends.config import FleetConfigError, Role, load_fleet, parse_fleet

ROOT = Path(__file__).resolve().parents[3]
FACTS = {"params": 1e9, "layers": 2, "hidden_size": 8, "kv_heads": 1, "head_dim": 8,
         "dtype_bytes": 2}
HW = {"peak_flops": 1e12, "mem_bandwidth": 1e11}


def pool(**over: Any) -> dict[str, Any]:
    return {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": ["http://h:1"],
            "model": FACTS, "hardware": HW, **over}


@pytest.mark.parametrize("name", ["fleet.example.yaml", "demo-fleet.yaml"])
def test_shipped_fleet_files_load(name: str) -> None:
    path = ROOT / "deploy" / name
    if not path.exists():
        pytest.fail(f"{path} is missing")
    fleet = load_fleet(path)
    assert fleet.pools


def test_defaults() -> None:
    fleet = parse_fleet({"pools": [pool()]})
    p = fleet.pools[0]
    assert p.role is Role.MIXED and not p.levers.prefix_caching and p.levers.speculative is None
    assert p.endpoint_urls() == ["http://h:1"]


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        ({"pools": [pool(engine="tgi")]}, "pools.0.engine", "'vllm' or 'sglang'"),
        ({"pools": [pool(endpoints=[])]}, "pools.0.endpoints", "at least 1"),
        ({"pools": [pool(endpoints=["not a url"])]}, "pools.0.endpoints.0", "URL"),
        ({"pools": [pool(model={**FACTS, "layers": 0})]}, "pools.0.model.layers", "greater than 0"),
        ({"pools": [pool(hardware={"peak_flops": 1})]}, "pools.0.hardware.mem_bandwidth",
         "Field required"),
        ({"pools": [pool(levers={"speculative": {"num_draft_tokens": -1}})]},
         "pools.0.levers.speculative.num_draft_tokens", "greater than 0"),
        ({"pools": [pool(colour="red")]}, "pools.0.colour", "Extra inputs are not permitted"),
        ({"pools": [pool(), pool()]}, "(top level)", "pool names must be unique"),
        ({"pools": [pool(), pool(name="q")]}, "(top level)", "an endpoint belongs to one pool"),
        ({"pools": [pool(role="prefill")]}, "(top level)", "needs 'pair'"),
        ({"pools": [pool(role="prefill", pair="p2"), pool(name="p2", endpoints=["http://h:2"])]},
         "(top level)", "is not a decode pool"),
        ({"pools": []}, "pools", "at least 1"),
    ],
)
def test_bad_fleets_name_the_field_and_problem(raw: dict[str, Any], field: str,
                                                problem: str) -> None:
    with pytest.raises(FleetConfigError) as info:
        parse_fleet(raw, source="fleet.yaml")
    message = str(info.value)
    assert message.startswith("fleet.yaml: ")
    assert f"{field}: " in message and problem in message, message


def test_unreadable_and_malformed_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FleetConfigError, match="missing.yaml: cannot read"):
        load_fleet(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    with pytest.raises(FleetConfigError, match="bad.yaml: not valid YAML"):
        load_fleet(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(FleetConfigError, match="scalar.yaml: expected a mapping"):
        load_fleet(scalar)
