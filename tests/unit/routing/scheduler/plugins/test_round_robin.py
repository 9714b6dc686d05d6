from __future__ import annotations

from routing.scheduler.plugins.round_robin import RoundRobin
from routing.snapshots import EndpointSnapshot
from tests.unit.routing.scheduler.snapshots import ctx, scored


def _tied(*urls: str) -> tuple[list[EndpointSnapshot], dict[str, float]]:
    return scored(dict.fromkeys(urls, 0.0))


def test_rotates_over_tied_endpoints_in_url_order() -> None:
    picker = RoundRobin()
    picks = [picker.pick(ctx([]), *_tied("c", "a", "b")).url for _ in range(5)]
    assert picks == ["a", "b", "c", "a", "b"]


def test_rotation_survives_endpoints_coming_and_going() -> None:
    picker = RoundRobin()
    assert picker.pick(ctx([]), *_tied("a", "b", "c")).url == "a"
    assert picker.pick(ctx([]), *_tied("a", "c")).url == "c"  # b dropped out: next after a
    assert picker.pick(ctx([]), *_tied("a", "b", "c")).url == "a"  # wraps after c
    assert picker.pick(ctx([]), *_tied("b", "c")).url == "b"


def test_only_top_scores_take_part() -> None:
    picker = RoundRobin()
    top = scored({"a": 0.2, "b": 0.9, "c": 0.9})
    assert [picker.pick(ctx([]), *top).url for _ in range(3)] == ["b", "c", "b"]


def test_instances_keep_separate_state() -> None:
    one, two = RoundRobin(), RoundRobin()
    assert one.pick(ctx([]), *_tied("a", "b")).url == "a"
    assert two.pick(ctx([]), *_tied("a", "b")).url == "a"
    assert one.pick(ctx([]), *_tied("a", "b")).url == "b"
