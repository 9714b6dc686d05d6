from __future__ import annotations

import pytest

from routing.scheduler.plugins.not_saturated import NotSaturated
from tests.unit.routing.scheduler.snapshots import ctx, ep


@pytest.mark.parametrize(
    ("waiting", "max_waiting", "kept"),
    [
        ({"a": 0, "b": 1, "c": None}, 0.0, ["a", "c"]),  # unknown waiting counts 0
        ({"a": 2, "b": 3}, 2.0, ["a"]),
        ({"a": 5, "b": 5}, 0.0, []),
        ({}, 0.0, []),
    ],
)
def test_keeps_endpoints_with_batch_room(waiting: dict[str, float | None], max_waiting: float,
                                         kept: list[str]) -> None:
    endpoints = [ep(u, waiting=w) for u, w in waiting.items()]
    plugin = NotSaturated(max_waiting)
    assert [e.url for e in plugin.filter(ctx(endpoints), endpoints)] == kept


def test_default_is_an_empty_queue() -> None:
    assert NotSaturated().max_waiting == 0.0
