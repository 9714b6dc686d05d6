"""SLO class choice, table-driven, and the fleet file's ``slos`` converted into the policy."""

from __future__ import annotations

from typing import Any

import pytest

from config.fleet import parse_fleet
from config.slos import ANY_MODEL, DEFAULT_CLASS
from gateway.telemetry.slos import ModelSlo, SloClass, SloPolicy, slo_policy
from routing.formulas import Bounds

TIGHT = Bounds(ttft_s=0.5, tpot_s=0.05, e2e_s=10.0)

POLICY = SloPolicy({
    "llama": ModelSlo(
        TIGHT,
        (
            SloClass("long", Bounds(e2e_s=60.0), min_max_tokens=1024),
            SloClass("huge", Bounds(e2e_s=300.0, ttft_s=2.0), min_max_tokens=4096),
            SloClass("batch", Bounds(ttft_s=30.0, e2e_s=600.0)),
        ),
    ),
    ANY_MODEL: ModelSlo(Bounds(e2e_s=30.0)),
})


@pytest.mark.parametrize(
    ("model", "max_tokens", "requested", "expected_class", "expected"),
    [
        ("llama", None, None, DEFAULT_CLASS, TIGHT),
        ("llama", 100, None, DEFAULT_CLASS, TIGHT),
        ("llama", 1024, None, "long", Bounds(0.5, 0.05, 60.0)),  # unset bounds inherited
        ("llama", 5000, None, "huge", Bounds(2.0, 0.05, 300.0)),  # the highest band that fits
        ("llama", 100, "batch", "batch", Bounds(30.0, 0.05, 600.0)),  # named by the client
        ("llama", 5000, "batch", "batch", Bounds(30.0, 0.05, 600.0)),  # the name wins
        ("llama", 100, "unknown", DEFAULT_CLASS, TIGHT),  # an unknown name is ignored
        ("other-model", 5000, "batch", DEFAULT_CLASS, Bounds(e2e_s=30.0)),  # the * entry
    ],
)
def test_the_slo_class_of_a_request(model: str, max_tokens: int | None, requested: str | None,
                                    expected_class: str, expected: Bounds) -> None:
    assert POLICY.bounds_for(model, max_tokens, requested) == (expected_class, expected)


def test_a_fleet_without_slos_has_no_bounds() -> None:
    assert SloPolicy().bounds_for("anything", 10, None) == (DEFAULT_CLASS, Bounds())
    assert POLICY.class_names() == {"default", "long", "huge", "batch"}


# -- from the fleet file ----------------------------------------------------------------------

FACTS = {"params": 1e9, "layers": 2, "hidden_size": 64, "kv_heads": 1, "head_dim": 64,
         "dtype_bytes": 2}
HW = {"peak_flops": 1e12, "mem_bandwidth": 1e11}


def _fleet(slos: Any) -> dict[str, Any]:
    return {"pools": [{"name": "p", "engine": "vllm", "models": ["m"],
                       "endpoints": ["http://127.0.0.1:1"], "model": FACTS, "hardware": HW}],
            "slos": slos}


def test_the_fleet_files_slos_become_the_policy() -> None:
    fleet = parse_fleet(_fleet({
        "m": {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": 20,
              "classes": [{"name": "long", "min_max_tokens": 1024, "e2e_s": 90},
                          {"name": "batch", "ttft_s": 30}]},
        "*": {"e2e_s": 60},
    }))
    policy = slo_policy(fleet)
    assert policy.bounds_for("m", 2000) == ("long", Bounds(0.5, 0.05, 90.0))
    assert policy.bounds_for("m", 10, "batch") == ("batch", Bounds(30.0, 0.05, 20.0))
    assert policy.bounds_for("x") == ("default", Bounds(e2e_s=60.0))


def test_no_slos_section_is_fine() -> None:
    raw = _fleet({})
    del raw["slos"]
    assert slo_policy(parse_fleet(raw)).models == {}


def test_the_classes_a_client_may_name_are_the_models_else_the_catch_alls() -> None:
    assert POLICY.classes_of("llama") == ("long", "huge", "batch")
    assert POLICY.classes_of("mistral") == ()  # the * entry has none
    assert SloPolicy().classes_of("llama") == ()
