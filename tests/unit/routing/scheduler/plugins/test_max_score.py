from __future__ import annotations

from collections import Counter

import pytest
from xxhash import xxh3_64_intdigest

from routing.scheduler.plugins.max_score import MaxScore, request_digest
from tests.unit.routing.scheduler.snapshots import ctx, features, scored


def with_digest(digest: int) -> object:
    feats = features(blocks=1)
    return ctx([], feats=type(feats)(**{**{f: getattr(feats, f) for f in feats.FIELDS},
                                        "block_hashes": (digest,)}))


@pytest.mark.parametrize(
    ("scores", "digest", "picked"),
    [
        ({"a": 0.2, "b": 0.9, "c": 0.5}, 7, "b"),
        ({"a": 0.5, "b": 0.9, "c": 0.9}, 0, "b"),  # tie: index digest mod 2 of (b, c)
        ({"a": 0.5, "b": 0.9, "c": 0.9}, 5, "c"),
        ({"c": 0.9, "b": 0.9}, 4, "c"),  # candidate order, not URL order
        ({"c": 0.9, "b": 0.9}, 3, "b"),
        ({"a": 0.1 + 0.2, "b": 0.3}, 1, "b"),  # float rounding is a tie
        ({"a": 0.0}, 99, "a"),
    ],
)
def test_picks_the_highest_and_breaks_ties_by_the_requests_digest(
        scores: dict[str, float], digest: int, picked: str) -> None:
    assert MaxScore().pick(with_digest(digest), *scored(scores)).url == picked  # type: ignore[arg-type]


def test_the_digest_is_the_deepest_block_else_the_session_else_zero() -> None:
    assert request_digest(features(prompt_tokens=300, block_tokens=100)) == 3  # hashes 1, 2, 3
    assert request_digest(features(blocks=0, session="00ff")) == 255
    assert request_digest(features(blocks=0)) == 0


def test_ties_spread_evenly_over_distinct_requests() -> None:
    # 8 idle replicas, 4,000 new conversations: each gets about an eighth, not all the first
    totals = {f"e{i}": 0.5 for i in range(8)}
    picker, counts = MaxScore(), Counter[str]()
    for digest in (xxh3_64_intdigest(f"conversation {i}".encode()) for i in range(4000)):
        counts[picker.pick(with_digest(digest), *scored(totals)).url] += 1  # type: ignore[arg-type]
    assert len(counts) == 8 and max(counts.values()) / (4000 / 8) < 1.15
