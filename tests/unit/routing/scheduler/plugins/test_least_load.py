from __future__ import annotations

import pytest

from routing.scheduler.plugins.least_load import LeastLoad
from routing.snapshots import EndpointSnapshot
from tests.unit.routing.scheduler.snapshots import by_url, ctx, ep, view


@pytest.mark.parametrize(
    ("endpoints", "shared", "expected"),
    [
        # score = 1 − load / max_load
        ([ep("a"), ep("b"), ep("c")], {"b": 2, "c": 4}, {"a": 1, "b": 0.5, "c": 0}),
        # the larger of the router's count and the engine's running + waiting: a=max(1, 1+3)=4,
        # b=max(0, 1)=1
        ([ep("a", running=1, waiting=3), ep("b", running=1)], {"a": 1},
         {"a": 0, "b": 0.75}),
        # the router's count wins over the engine's when larger
        ([ep("a", running=1), ep("b", running=2)], {"a": 4}, {"a": 0, "b": 0.5}),
        ([ep("a"), ep("b")], {}, {"a": 1, "b": 1}),  # all idle
        ([ep("a")], {"a": 3}, {"a": 0}),  # a single busy candidate is also the busiest
        ([], {}, {}),
    ],
)
def test_scores(endpoints: list[EndpointSnapshot], shared: dict[str, int],
                expected: dict[str, float]) -> None:
    scores = by_url(LeastLoad(), ctx(endpoints, state=view(load=shared)), endpoints)
    assert scores == pytest.approx(expected)
