from __future__ import annotations

import pytest

from routing.scheduler.plugins.session_affinity import SessionAffinity
from tests.unit.routing.scheduler.snapshots import by_url, ctx, ep, features, view


@pytest.mark.parametrize(
    ("session", "session_endpoint", "expected"),
    [
        ("s1", "b", {"a": 0, "b": 1, "c": 0}),
        ("s1", None, {"a": 0, "b": 0, "c": 0}),  # a new session
        ("s1", "gone", {"a": 0, "b": 0, "c": 0}),  # its endpoint is not a candidate
        (None, "b", {"a": 0, "b": 0, "c": 0}),  # no session on the request
    ],
)
def test_scores(session: str | None, session_endpoint: str | None,
                expected: dict[str, float]) -> None:
    endpoints = [ep("a"), ep("b"), ep("c")]
    c = ctx(endpoints, features(session=session), view(session_endpoint=session_endpoint))
    assert by_url(SessionAffinity(), c, endpoints) == expected


def test_empty_candidates() -> None:
    assert by_url(SessionAffinity(), ctx([], features(session="s")), []) == {}
