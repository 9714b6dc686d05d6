from __future__ import annotations

from routing.scheduler.plugins.random_top import RandomTop
from tests.unit.routing.scheduler.snapshots import ctx, scored

SCORED = scored({"a": 0.9, "b": 0.2, "c": 0.9})


def _draws(picker: RandomTop, n: int = 200) -> list[str]:
    return [picker.pick(ctx([]), *SCORED).url for _ in range(n)]


def test_draws_only_among_the_top_and_spreads_over_them() -> None:
    draws = _draws(RandomTop(seed=1))
    assert set(draws) == {"a", "c"}


def test_same_seed_same_sequence_and_seeds_differ() -> None:
    assert _draws(RandomTop(seed=7)) == _draws(RandomTop(seed=7))
    assert _draws(RandomTop(seed=7)) != _draws(RandomTop(seed=8))


def test_single_top_is_always_picked() -> None:
    two = scored({"a": 0.1, "b": 0.7})
    assert {RandomTop().pick(ctx([]), *two).url for _ in range(50)} == {"b"}
