from __future__ import annotations

import pytest

from routing.scheduler.plugins.prefix_match import PrefixMatch
from tests.unit.routing.scheduler.snapshots import by_url, ctx, ep, features, view


@pytest.mark.parametrize(
    ("blocks", "matched", "expected"),
    [
        (10, {"a": 5, "b": 10}, {"a": 0.5, "b": 1.0, "c": 0.0}),
        (4, {"a": 9}, {"a": 1.0, "b": 0.0, "c": 0.0}),  # a stale longer match is capped
        (0, {"a": 3}, {"a": 0.0, "b": 0.0, "c": 0.0}),  # no complete block
    ],
)
def test_scores_are_matched_over_total_blocks(blocks: int, matched: dict[str, int],
                                              expected: dict[str, float]) -> None:
    endpoints = [ep("a"), ep("b"), ep("c")]
    c = ctx(endpoints, features(prompt_tokens=blocks * 100), view(matched=matched))
    assert by_url(PrefixMatch(), c, endpoints) == pytest.approx(expected)


def test_empty_candidates() -> None:
    assert by_url(PrefixMatch(), ctx([]), []) == {}
