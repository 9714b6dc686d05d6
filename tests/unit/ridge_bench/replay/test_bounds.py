"""ridge_bench.replay.bounds: the unlimited-cache and shared-LRU bounds on worked traces."""

from __future__ import annotations

import pytest

from ridge_bench.replay.bounds import lru_bound, unlimited_bound
from ridge_bench.replay.trace import TraceEntry


def _e(length: int, *ids: int) -> TraceEntry:
    return TraceEntry(0.0, length, 1, ids)


def test_unlimited_bound_counts_the_longest_shared_prefix_in_engine_blocks() -> None:
    entries = [_e(20, 1, 2, 3),       # nothing before it
               _e(30, 1, 2, 3, 4),    # shares its parent's 20 tokens → 16 (one engine block)
               _e(30, 1, 2, 3, 4),    # the same prompt again: 29 (never the last token) → 16
               _e(12, 1, 5)]          # shares block 1 (8 tokens) → 0 whole engine blocks
    assert unlimited_bound(entries, block_tokens=8, engine_block=16) == \
        pytest.approx((0 + 16 + 16 + 0) / 92)
    assert unlimited_bound(entries, block_tokens=8, engine_block=1) == \
        pytest.approx((0 + 20 + 29 + 8) / 92)


def test_lru_bound_evicts_the_least_recently_used_block() -> None:
    a, b, a_again = _e(16, 1, 2), _e(16, 3, 4), _e(16, 1, 2)
    assert lru_bound([a, b, a_again], capacity_tokens=32, block_tokens=8, engine_block=1) == \
        pytest.approx(15 / 48)  # both fit: the repeat is cached but for its last token
    assert lru_bound([a, b, a_again], capacity_tokens=16, block_tokens=8) == 0.0
    # a partial block held counts its own tokens and ends the prefix; whole engine blocks only
    assert lru_bound([_e(12, 1, 2), _e(16, 1, 2)], capacity_tokens=64, block_tokens=8,
                     engine_block=1) == pytest.approx(12 / 28)
    assert lru_bound([_e(12, 1, 2), _e(16, 1, 2)], capacity_tokens=64, block_tokens=8,
                     engine_block=8) == pytest.approx(8 / 28)


def test_a_bound_with_room_for_everything_is_the_unlimited_one() -> None:
    entries = [_e(24, 1, 2, 3), _e(40, 1, 2, 3, 4, 5), _e(16, 6, 7), _e(24, 6, 7, 8)]
    assert lru_bound(entries, 10_000, block_tokens=8, engine_block=8) == \
        pytest.approx(unlimited_bound(entries, block_tokens=8, engine_block=8))
    with pytest.raises(ValueError):
        lru_bound(entries, 4, block_tokens=8)
