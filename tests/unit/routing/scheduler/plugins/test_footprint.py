"""Scorer ``footprint``: new work by the cache it would evict, follow-ups left alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from routing.scheduler.plugins.footprint import Footprint
from tests.unit.routing.scheduler.snapshots import ctx, ep, features, view

SIZES = {"a": 99, "b": 49, "c": 199}


def scores(matched: dict[str, int], blocks: int = 10, threshold: float = 0.5,
           sizes: dict[str, int] | None = SIZES) -> dict[str, float]:
    endpoints = [ep("a"), ep("b"), ep("c")]
    state = view(matched=matched)
    if sizes is not None:
        state = replace(state, footprint=lambda url: sizes.get(url, 0))
    c = ctx(endpoints, features(prompt_tokens=blocks * 100), state)
    return dict(Footprint(threshold).score(c, endpoints))


def test_new_work_scores_the_smallest_footprint_highest() -> None:
    # (49 + 1) / (F + 1): b 1, a 50 / 100, c 50 / 200
    assert scores({"a": 2}) == pytest.approx({"a": 0.5, "b": 1.0, "c": 0.25})


def test_a_request_continuing_a_cached_prefix_is_left_to_the_other_scorers() -> None:
    assert scores({"c": 5}) == {"a": 1.0, "b": 1.0, "c": 1.0}  # 5 of 10 blocks: at threshold
    assert scores({"c": 5}, threshold=0.6)["b"] == 1.0
    assert scores({"c": 5}, threshold=0.6)["c"] == pytest.approx(0.25)


def test_without_a_footprint_or_candidates_every_score_is_neutral() -> None:
    assert scores({}, sizes=None) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert Footprint().score(ctx([]), []) == {}


def test_the_threshold_is_a_fraction() -> None:
    with pytest.raises(ValueError, match="threshold"):
        Footprint(1.5)
