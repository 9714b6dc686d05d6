from __future__ import annotations

import pytest

from routing.scheduler.plugins.healthy import Healthy
from tests.unit.routing.scheduler.snapshots import ctx, ep


@pytest.mark.parametrize(
    ("health", "kept"),
    [
        ({"a": True, "b": False, "c": True}, ["a", "c"]),
        ({"a": False}, []),
        ({}, []),
    ],
)
def test_keeps_healthy_endpoints_in_order(health: dict[str, bool], kept: list[str]) -> None:
    endpoints = [ep(u, healthy=h) for u, h in health.items()]
    assert [e.url for e in Healthy().filter(ctx(endpoints), endpoints)] == kept
