"""The fleet file's ``slos`` section: parsing, validation, conversion to routing's policy."""

from __future__ import annotations

from typing import Any

import pytest

from backends.config import FleetConfigError, parse_fleet
from routing.goodput import Bounds

FACTS = {"params": 1e9, "layers": 2, "hidden_size": 64, "kv_heads": 1, "head_dim": 64,
         "dtype_bytes": 2}
HW = {"peak_flops": 1e12, "mem_bandwidth": 1e11}


def _fleet(slos: Any) -> dict[str, Any]:
    return {"pools": [{"name": "p", "engine": "vllm", "models": ["m"],
                       "endpoints": ["http://127.0.0.1:1"], "model": FACTS, "hardware": HW}],
            "slos": slos}


def test_slos_become_routing_policy() -> None:
    fleet = parse_fleet(_fleet({
        "m": {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": 20,
              "classes": [{"name": "long", "min_max_tokens": 1024, "e2e_s": 90},
                          {"name": "batch", "ttft_s": 30}]},
        "*": {"e2e_s": 60},
    }))
    policy = fleet.slo_policy()
    assert policy.bounds_for("m", 2000) == ("long", Bounds(0.5, 0.05, 90.0))
    assert policy.bounds_for("m", 10, "batch") == ("batch", Bounds(30.0, 0.05, 20.0))
    assert policy.bounds_for("x") == ("default", Bounds(e2e_s=60.0))


def test_no_slos_section_is_fine() -> None:
    raw = _fleet({})
    del raw["slos"]
    assert parse_fleet(raw).slo_policy().models == {}


@pytest.mark.parametrize(
    ("slos", "message"),
    [
        ({"nope": {"e2e_s": 1}}, "slos name models no pool serves: ['nope']"),
        ({"m": {"e2e_s": -1}}, "slos.m.e2e_s"),
        ({"m": {"ttft": 1}}, "slos.m.ttft"),
        ({"m": {"classes": [{"name": "a"}, {"name": "a"}]}}, "class names must be unique"),
        ({"m": {"classes": [{"name": "default"}]}}, "class names must be unique"),
        ({"m": {"classes": [{"name": "bad name"}]}}, "slos.m.classes.0.name"),
    ],
)
def test_bad_slos_are_refused_with_the_field_named(slos: Any, message: str) -> None:
    with pytest.raises(FleetConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_fleet(_fleet(slos), source="f.yaml")
