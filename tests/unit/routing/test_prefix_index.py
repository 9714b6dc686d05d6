from __future__ import annotations

import tracemalloc

import pytest

from routing.features import block_hashes
from routing.prefix_index import PrefixIndex
from tests.unit.routing.state_contract import FakeClock

A, B, C = "http://a", "http://b", "http://c"


def chain(text: str) -> tuple[int, ...]:
    return block_hashes(text, 4)


SHARED = chain("s" * 40)  # 10 blocks


@pytest.mark.parametrize(
    ("records", "query", "endpoints", "expected"),
    [
        ([], SHARED, None, {}),
        ([(A, SHARED)], SHARED, None, {A: 10}),
        ([(A, SHARED)], chain("s" * 40 + "tail"), None, {A: 10}),
        ([(A, chain("s" * 24))], SHARED, None, {A: 6}),
        ([(A, chain("s" * 24)), (B, SHARED)], SHARED, None, {A: 6, B: 10}),
        ([(A, chain("s" * 24)), (B, SHARED)], SHARED, [A], {A: 6}),
        ([(A, SHARED)], SHARED, [C], {}),
        ([(A, SHARED)], chain("x" + "s" * 39), None, {}),
        ([(A, SHARED)], (), None, {}),
        ([(A, SHARED[:3] + SHARED[5:])], SHARED, None, {A: 3}),  # a gap: the prefix before it
    ],
)
def test_match_gives_the_leading_blocks_each_endpoint_holds(
    records: list[tuple[str, tuple[int, ...]]], query: tuple[int, ...],
    endpoints: list[str] | None, expected: dict[str, int],
) -> None:
    index = PrefixIndex(1000, 60.0, FakeClock())
    for url, hashes in records:
        index.record(url, hashes)
    assert index.match(query, endpoints) == expected


def test_lru_eviction_drops_the_least_recently_recorded() -> None:
    index = PrefixIndex(20, 60.0, FakeClock())
    a, b, c = chain("a" * 40), chain("b" * 40), chain("c" * 40)
    index.record(A, a)
    index.record(B, b)
    index.record(A, a)  # refreshed: now b is the least recent
    index.record(C, c)
    assert len(index) == 20
    assert [index.match(h) for h in (a, b, c)] == [{A: 10}, {}, {C: 10}]


def test_eviction_cuts_a_chain_from_its_tail_so_its_prefix_still_matches() -> None:
    index = PrefixIndex(4, 60.0, FakeClock())
    index.record(A, SHARED)
    assert len(index) == 4
    assert index.match(SHARED) == {A: 4}


def test_a_later_partial_record_keeps_the_prefix_consistent() -> None:
    index = PrefixIndex(12, 60.0, FakeClock())
    index.record(A, SHARED)  # 10 entries
    index.record(A, chain("s" * 12 + "q" * 12))  # 3 shared blocks refreshed, 3 new: 13 > 12
    assert index.match(SHARED) == {A: 9}  # the oldest entry, SHARED's last block, went


def test_entries_older_than_the_age_limit_do_not_match_and_are_purged() -> None:
    clock = FakeClock()
    index = PrefixIndex(1000, 30.0, clock)
    index.record(A, SHARED)
    clock.advance(20.0)
    index.record(B, SHARED)
    assert index.match(SHARED) == {A: 10, B: 10}
    clock.advance(15.0)  # A's record is 35 s old, B's 15 s
    assert index.match(SHARED) == {B: 10}
    index.record(C, chain("c" * 8))  # purges stale entries incrementally
    assert len(index) == 10 + 2


def test_forget_endpoint_stops_its_matches_and_a_return_starts_empty() -> None:
    index = PrefixIndex(1000, 60.0, FakeClock())
    index.record(A, SHARED)
    index.record(B, SHARED)
    index.forget_endpoint(A)
    index.forget_endpoint("http://never-seen")
    assert index.match(SHARED) == {B: 10}
    index.record(A, SHARED[:2])
    assert index.match(SHARED) == {A: 2, B: 10}


def test_forget_drops_a_tail_of_one_endpoint_only() -> None:
    index = PrefixIndex(1000, 60.0, FakeClock())
    index.record(A, SHARED)
    index.record(B, SHARED)
    index.forget(A, SHARED[4:])  # a failed request's blocks past what A held before it
    index.forget("http://never-seen", SHARED)
    assert index.match(SHARED) == {A: 4, B: 10}
    assert len(index) == 14
    index.forget(A, SHARED)
    assert index.match(SHARED) == {B: 10}


@pytest.mark.parametrize(("max_entries", "max_age_s"), [(0, 1.0), (10, 0.0)])
def test_limits_must_be_positive(max_entries: int, max_age_s: float) -> None:
    with pytest.raises(ValueError):
        PrefixIndex(max_entries, max_age_s)


def test_two_million_distinct_blocks_stay_within_the_cap() -> None:
    cap, batch, total = 100_000, 200, 2_000_000
    endpoints = [f"http://e{i}" for i in range(8)]
    used: dict[int, int] = {}  # blocks recorded → bytes traced
    tracemalloc.start()
    try:
        index = PrefixIndex(cap, 3600.0, FakeClock())
        for n, start in enumerate(range(0, total, batch)):
            hashes = range(start * 7919 + 1, (start + batch) * 7919 + 1, 7919)  # distinct
            index.record(endpoints[n % 8], hashes)
            assert len(index) <= cap
            if start + batch in (total // 4, total):
                used[start + batch] = tracemalloc.get_traced_memory()[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(index) == cap
    last = tuple(range((total - batch) * 7919 + 1, total * 7919 + 1, 7919))
    assert index.match(last) == {endpoints[(total // batch - 1) % 8]: batch}
    print(f"\nprefix index: {cap} entries after {total} blocks: "
          f"{used[total] / cap:.0f} B/entry, peak {peak / 2**20:.1f} MiB")
    assert used[total] < used[total // 4] * 1.05  # 4× the blocks, no more memory
    assert used[total] < cap * 300  # bytes per entry, with room for allocator overhead
