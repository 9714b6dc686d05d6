"""The fleet file's ``slos`` section: parsing and validation (the policy it becomes is
:mod:`gateway.telemetry.slos`, tested in ``tests/unit/gateway/telemetry/test_slos.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from config.fleet import FleetConfigError, parse_fleet

FACTS = {"params": 1e9, "layers": 2, "hidden_size": 64, "kv_heads": 1, "head_dim": 64,
         "dtype_bytes": 2}
HW = {"peak_flops": 1e12, "mem_bandwidth": 1e11}


def _fleet(slos: Any) -> dict[str, Any]:
    return {"pools": [{"name": "p", "engine": "vllm", "models": ["m"],
                       "endpoints": ["http://127.0.0.1:1"], "model": FACTS, "hardware": HW}],
            "slos": slos}


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
