"""Scorer ``footprint``: new work by the cache it would evict, follow-ups left alone."""

from __future__ import annotations

import pytest

from routing.scheduler.plugins.footprint import Footprint
from tests.unit.routing.scheduler.snapshots import by_url, ctx, ep, features, view

SIZES = {"a": 99, "b": 49, "c": 199}


def scores(matched: dict[str, int], blocks: int = 10, threshold: float = 0.5,
           sizes: dict[str, int] | None = SIZES, load: dict[str, int] | None = None,
           slack: float = 2.0, running: float | None = None) -> dict[str, float]:
    endpoints = [ep("a"), ep("b", running=running), ep("c")]
    state = view(matched=matched, load=load)
    if sizes is not None:
        size = sizes.get  # the same figures by either measure
        state = state.replaced(recent_requests=lambda url: size(url, 0),
                               footprint=lambda url: size(url, 0))
    c = ctx(endpoints, features(prompt_tokens=blocks * 100), state)
    return dict(by_url(Footprint(threshold, slack), c, endpoints))


def test_new_work_scores_the_smallest_footprint_highest() -> None:
    # 1 − (F − 49) / (199 − 49): b 1, a 1 − 50/150, c 0
    assert scores({}) == pytest.approx({"a": 2 / 3, "b": 1.0, "c": 0.0})
    even = {"a": 7, "b": 7, "c": 7}
    assert scores({}, sizes=even) == {"a": 1.0, "b": 1.0, "c": 1.0}  # no spread: all alike


def test_a_partial_match_below_the_threshold_counts_for_nothing_here() -> None:
    assert scores({"c": 4}) == scores({})  # 4 of 10 blocks (a shared system prompt, say)


def test_only_the_least_loaded_within_the_slack_are_eligible() -> None:
    # loads a 1, b 4, c 3 (router in flight): within 2 of the least, a and c
    assert scores({}, load={"a": 1, "b": 4, "c": 3}) == pytest.approx(
        {"a": 1.0, "b": 0.0, "c": 0.0})  # among a and c, a's 99 the least, c's 199 the most
    # the engine's own running + waiting counts too (b runs 6), and slack 0 leaves the least
    assert scores({}, load={"a": 1, "c": 1}, running=6) == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert scores({}, load={"a": 1, "b": 3, "c": 2}, slack=0) == {"a": 1.0, "b": 0.0, "c": 0.0}


def test_the_measure_is_recent_requests_or_recorded_blocks() -> None:
    endpoints = [ep("a"), ep("b")]
    state = view().replaced(recent_requests={"a": 9, "b": 4}.__getitem__,
                            footprint={"a": 100, "b": 400}.__getitem__)
    c = ctx(endpoints, features(), state)
    assert by_url(Footprint(by="requests"), c, endpoints) == {"a": 0.0, "b": 1.0}
    assert by_url(Footprint(by="blocks"), c, endpoints) == {"a": 1.0, "b": 0.0}
    with pytest.raises(ValueError, match="by must be one of requests, blocks"):
        Footprint(by="tokens")


def test_a_request_continuing_a_cached_prefix_is_left_to_the_other_scorers() -> None:
    assert scores({"c": 5}) == {"a": 1.0, "b": 1.0, "c": 1.0}  # 5 of 10 blocks: at threshold
    assert scores({"c": 5}, threshold=0.6) == pytest.approx(  # below it: new work
        {"a": 2 / 3, "b": 1.0, "c": 0.0})


def test_without_a_footprint_or_candidates_every_score_is_neutral() -> None:
    assert scores({}, sizes=None) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert by_url(Footprint(), ctx([]), []) == {}
    assert by_url(Footprint(), ctx([], state=view().replaced(recent_requests=len)), []) == {}


def test_the_threshold_is_a_fraction_and_the_slack_not_negative() -> None:
    with pytest.raises(ValueError, match="threshold"):
        Footprint(1.5)
    with pytest.raises(ValueError, match="slack"):
        Footprint(slack=-1.0)
    with pytest.raises(ValueError, match="slack"):
        Footprint(slack=float("nan"))
