from __future__ import annotations

import pytest

from routing.scheduler.plugins.max_score import MaxScore
from tests.unit.routing.scheduler.snapshots import ctx, scored


@pytest.mark.parametrize(
    ("scores", "picked"),
    [
        ({"a": 0.2, "b": 0.9, "c": 0.5}, "b"),
        ({"a": 0.5, "b": 0.9, "c": 0.9}, "b"),  # tie: first in candidate order
        ({"c": 0.9, "b": 0.9}, "c"),  # candidate order, not URL order
        ({"a": 0.1 + 0.2, "b": 0.3}, "a"),  # float rounding is a tie
        ({"a": 0.0}, "a"),
    ],
)
def test_picks_highest_first_listed(scores: dict[str, float], picked: str) -> None:
    assert MaxScore().pick(ctx([]), *scored(scores)).url == picked
