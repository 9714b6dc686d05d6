"""config.plan_section: the fleet file's ``plan:``, what ridge plan predicted per pool."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from config.fleet import FleetConfigError, parse_fleet
from config.plan_section import Wall
from routing.binding_wall import WALLS

POOL = {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": ["http://127.0.0.1:1"],
        "model": "llama-3-8b", "hardware": "nvidia-l4"}


def _fleet(plan: dict[str, Any]) -> Any:
    return parse_fleet({"pools": [POOL], "plan": plan})


def test_a_wall_is_one_the_rule_can_name_or_none_seen() -> None:
    assert set(get_args(Wall)) == {*WALLS, "-"}


def test_a_plan_names_pools_of_the_fleet_with_shares_and_walls() -> None:
    fleet = _fleet({"source": "t.jsonl", "pools": {"p": {"share": 1.0, "wall": "compute"}}})
    assert fleet.plan is not None and fleet.plan.pools["p"].wall == "compute"
    for bad in ({"pools": {"nope": {"share": 1.0}}}, {"pools": {"p": {"share": 1.5}}},
                {"pools": {"p": {"share": 0.5, "wall": "gravity"}}}):
        with pytest.raises(FleetConfigError):
            _fleet(bad)
