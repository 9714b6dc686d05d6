"""SLO evaluation and SLO class choice, table-driven."""

from __future__ import annotations

import pytest

from routing.goodput import (
    ANY_MODEL,
    DEFAULT_CLASS,
    Bounds,
    Measured,
    ModelSlo,
    SloClass,
    SloPolicy,
    evaluate,
)

TIGHT = Bounds(ttft_s=0.5, tpot_s=0.05, e2e_s=10.0)


@pytest.mark.parametrize(
    ("measured", "violated"),
    [
        (Measured(200, e2e_s=2.0, ttft_s=0.2, tpot_s=0.02), ()),
        (Measured(200, e2e_s=10.0, ttft_s=0.5, tpot_s=0.05), ()),  # a bound is met at equality
        (Measured(200, e2e_s=2.0, ttft_s=0.6, tpot_s=0.02), ("ttft",)),
        (Measured(200, e2e_s=2.0, ttft_s=0.2, tpot_s=0.06), ("tpot",)),
        (Measured(200, e2e_s=12.0, ttft_s=0.9, tpot_s=0.2), ("ttft", "tpot", "e2e")),
        (Measured(200, e2e_s=12.0), ("e2e",)),  # non-streamed: no TTFT/TPOT to hold against
        (Measured(502, e2e_s=0.1), ("error",)),
        (Measured(504, e2e_s=300.0, ttft_s=None), ("error",)),
    ],
)
def test_violated_bounds_are_named(measured: Measured, violated: tuple[str, ...]) -> None:
    verdict = evaluate(TIGHT, measured)
    assert verdict.evaluated
    assert verdict.violated == violated
    assert verdict.good is (not violated)


@pytest.mark.parametrize("status", [400, 404, 413, 499])
def test_client_errors_are_not_held_against_the_slo(status: int) -> None:
    verdict = evaluate(TIGHT, Measured(status, e2e_s=100.0))
    assert not verdict.evaluated and not verdict.good


def test_no_bound_means_nothing_to_violate() -> None:
    assert evaluate(Bounds(), Measured(200, e2e_s=1e9, ttft_s=1e9, tpot_s=1e9)).good
    assert evaluate(Bounds(e2e_s=1.0), Measured(200, e2e_s=0.5, ttft_s=99.0)).good


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


def test_bounds_by_name_lists_only_set_bounds() -> None:
    assert Bounds(ttft_s=1.0, e2e_s=2.0).by_name() == {"ttft": 1.0, "e2e": 2.0}
