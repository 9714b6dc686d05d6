from __future__ import annotations

import random
import tracemalloc

import pytest

from routing.features import block_hashes
from routing.prefix_index import EXACT, KeyLayout, PrefixIndex
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


def _reference(layout: KeyLayout, recorded: int, query: int) -> int:
    """The blocks a match of a ``query``-block chain should give on an endpoint that holds
    the first ``recorded`` blocks of it, worked out key by key: the deepest key position of
    the query that the recorded chain also has as a key."""
    def positions(n: int) -> set[int]:
        return {p for p in range(n) if p < layout.dense or p == n - 1
                or (p - layout.dense + 1) % layout.stride == 0}
    held = positions(recorded) & positions(query)
    return max(held) + 1 if held else 0


LAYOUTS = [EXACT, KeyLayout(), KeyLayout(dense=3, stride=5)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["exact", "default", "3+5"])
@pytest.mark.parametrize("seed", range(20))
def test_match_equals_a_key_by_key_count_whatever_order_the_lengths_come_in(
        seed: int, layout: KeyLayout) -> None:
    """Each endpoint's search starts from the previous endpoint's length: lengths equal to it,
    above it, below it and zero must all come out as counted key by key."""
    rng = random.Random(seed)
    query = chain("q" * 4 * 30)  # 30 blocks
    index, held = PrefixIndex(10_000, 60.0, FakeClock(), layout=layout), {}
    for n in range(12):
        url, length = f"http://e{n}", rng.choice([0, 1, 2, 5, 5, 5, 17, 19, 20, 29, 30, 30])
        if length:
            index.record(url, query[:length])
            if blocks := _reference(layout, length, 30):
                held[url] = blocks
    urls = [f"http://e{n}" for n in range(12)]
    rng.shuffle(urls)
    assert index.match(query, urls) == {u: held[u] for u in urls if u in held}
    assert index.match(query) == held


@pytest.mark.parametrize("layout", LAYOUTS, ids=["exact", "default", "3+5"])
def test_the_last_matchs_count_only_orders_the_first_search(layout: KeyLayout) -> None:
    """The first endpoint's search starts from the last match's count: a count left by another
    prompt, above the chain's length, below it or equal, changes nothing."""
    index = PrefixIndex(10_000, 60.0, FakeClock(), layout=layout)
    other, query = chain("a" * 4 * 40), chain("b" * 4 * 30)
    index.record("http://e0", other)
    for length in (1, 2, 5, 17, 19, 29, 30):
        index.record("http://e1", query[:length])
        blocks = _reference(layout, length, 30)
        expected = {"http://e1": blocks} if blocks else {}
        for before in (other, other[:3], query[:length], query):
            index.match(before)  # leaves its own count behind
            assert index.match(query) == expected


@pytest.mark.parametrize(("recorded", "query", "expected"), [
    (16, 40, 16),  # the dense blocks: exact
    (40, 40, 40),  # a chain held whole: exact
    (40, 41, 40),  # the follow-up of a 40-block turn whose last block is a key of both
    (38, 41, 36),  # ... of a 38-block turn: block 35 is the deepest key both have
    (24, 40, 24),  # block 23 is a key of both (16 + 2 × 4 − 1)
    (23, 40, 20),  # short by less than a stride
    (17, 40, 16),
    (20, 20, 20),
])
def test_the_default_layout_matches_to_a_key(recorded: int, query: int, expected: int) -> None:
    q = chain("k" * 4 * query)
    index = PrefixIndex(10_000, 60.0, FakeClock())
    index.record(A, q[:recorded])
    assert index.match(q) == {A: expected} == {A: _reference(KeyLayout(), recorded, query)}


def test_a_key_layout_keeps_the_dense_blocks_then_one_in_stride_and_the_last() -> None:
    layout, chain_ = KeyLayout(dense=4, stride=3), tuple(range(100, 115))  # 15 blocks
    # positions 0-3, then 6, 9, 12, and the last (14)
    assert layout.keys(chain_) == (100, 101, 102, 103, 106, 109, 112, 114)
    assert layout.keys(chain_[:13]) == (100, 101, 102, 103, 106, 109, 112)  # 12 is the last
    assert layout.keys(chain_[:3]) == chain_[:3] and EXACT.keys(chain_) == chain_
    assert [layout.count(n) for n in (0, 3, 4, 5, 7, 8, 15)] == [0, 3, 4, 5, 5, 6, 8]
    assert [layout.blocks(k, 15) for k in (0, 4, 5, 7, 8)] == [0, 4, 7, 13, 15]
    assert [layout.first_key(b, 15) for b in (0, 4, 5, 7, 12, 13, 14, 15)] == \
        [0, 4, 4, 5, 6, 7, 7, 8]
    with pytest.raises(ValueError):
        KeyLayout(dense=0)


def test_a_long_prompt_takes_about_a_quarter_of_the_entries() -> None:
    index = PrefixIndex(1_000_000, 60.0, FakeClock())
    index.record(A, tuple(range(1, 2001)))  # 2,000 blocks: 16 + 496 + the last
    assert len(index) == 16 + (2000 - 16) // 4 == 512
    assert index.held_blocks() == {A: 16 + 4 * 496}


def test_capacity_keeps_the_recent_generation_and_what_was_recorded_again() -> None:
    index = PrefixIndex(40, 60.0, FakeClock())  # generations of 20 entries
    a, b, c, d, e, f = (chain(x * 40) for x in "abcdef")  # 10 blocks each
    index.record(A, a)
    index.record(B, b)
    index.record(A, a)  # recorded again: no new entry
    index.record(C, c)  # 30 entries in the current generation > 20: it becomes the previous
    assert [index.match(h) for h in (a, b, c)] == [{A: 10}, {B: 10}, {C: 10}]
    index.record(A, a)  # in use: back into the current generation
    index.record(B, d)
    index.record(C, e)  # 30 > 20 again: the previous generation (b, c) is dropped
    assert [index.match(h) for h in (a, b, c, d, e)] == [
        {A: 10}, {}, {}, {B: 10}, {C: 10}]
    assert len(index) <= 40
    index.record(A, f)
    assert index.match(f) == {A: 10}


def test_the_footprint_counts_an_endpoints_entries_in_both_generations() -> None:
    index = PrefixIndex(40, 60.0, FakeClock())  # generations of 20 entries
    a, b, c = (chain(x * 40) for x in "abc")  # 10 blocks each
    index.record(A, a)
    index.record(B, b)
    assert (index.footprint(A), index.footprint(B), index.footprint(C)) == (10, 10, 0)
    index.record(C, c)  # 30 > 20: a, b, c become the previous generation
    index.record(A, a)  # a again: in the current generation too, so counted twice
    assert (index.footprint(A), index.footprint(B), index.footprint(C)) == (20, 10, 10)
    index.forget_endpoint(B)
    assert index.footprint(B) == 0


def test_the_footprint_weighs_a_coarse_entry_as_the_blocks_it_stands_for() -> None:
    index = PrefixIndex(1000, 60.0, FakeClock(), layout=KeyLayout(dense=4, stride=3))
    index.record(A, tuple(range(100, 115)))  # 15 blocks: 4 dense keys, then 106, 109, 112, 114
    assert index.footprint(A) == 4 + 3 * 4  # the last key stands for fewer, counted as 3


def test_recent_requests_count_the_chains_recorded_in_both_generations() -> None:
    index = PrefixIndex(40, 60.0, FakeClock())  # generations of 20 entries
    a, b, c = (chain(x * 40) for x in "abc")  # 10 blocks each
    index.record(A, a)
    index.record(A, a)  # the same chain again: a second request
    index.record(B, b)
    assert [index.recent_requests(x) for x in (A, B, C)] == [2, 1, 0]
    index.record(A, a, request=False)  # 30 > 20: rotates; a request finishing: not counted
    assert [index.recent_requests(x) for x in (A, B, C)] == [2, 1, 0]  # now the previous
    index.record(C, c)
    index.record(C, c)  # 30 > 20: rotates again, and the counts of the first go
    assert [index.recent_requests(x) for x in (A, B, C)] == [0, 0, 2]


def test_the_recent_requests_lookup_counts_alike_and_forgets_with_the_endpoint() -> None:
    index = PrefixIndex(1000, 60.0, FakeClock())
    lookup = index.recent_requests_of  # what a view calls per candidate
    index.record(A, SHARED)
    index.record(A, SHARED)
    index.record(B, SHARED)
    assert [lookup(x) for x in (A, B, C)] == [index.recent_requests(x) for x in (A, B, C)] \
        == [2, 1, 0]
    index.forget_endpoint(A)  # restarted: its counts go with its entries
    assert [lookup(x) for x in (A, B)] == [0, 1]
    index.clear()
    assert lookup(B) == 0


def test_a_chain_matched_then_recorded_as_a_list_is_keyed_afresh() -> None:
    index = PrefixIndex(1000, 60.0, FakeClock())
    blocks = list(SHARED)
    assert index.match(blocks) == {}
    blocks[5:] = chain("u" * 40)[:5]  # the same list, changed in between: its own keys
    index.record(A, blocks)
    assert index.match(tuple(blocks)) == {A: 10} and index.match(SHARED) == {A: 5}


def test_a_chain_is_held_whole_until_its_generation_goes() -> None:
    index = PrefixIndex(40, 60.0, FakeClock())  # generations of 20 entries
    partial = chain("s" * 12 + "q" * 12)  # SHARED's first 3 blocks, then 3 of its own
    index.record(A, SHARED)
    index.record(A, partial)  # 13 entries
    assert index.match(SHARED) == {A: 10} and index.match(partial) == {A: 6}
    index.record(A, chain("z" * 40))  # 13 + 10 > 20: a new generation; the others stay whole
    assert index.match(SHARED) == {A: 10} and index.match(partial) == {A: 6}
    index.record(A, partial)  # in use: copied whole into the current generation
    index.record(B, chain("w" * 40))
    index.record(B, chain("v" * 40))  # past 20 again: SHARED's generation is dropped
    assert index.match(SHARED) == {A: 3} and index.match(partial) == {A: 6}


def test_a_chain_longer_than_half_the_capacity_is_recorded_as_its_prefix() -> None:
    index = PrefixIndex(12, 60.0, FakeClock())
    index.record(A, SHARED)  # 10 blocks > 6
    assert index.match(SHARED) == {A: 6} and len(index) == 6


def test_entries_older_than_the_age_limit_do_not_match() -> None:
    clock = FakeClock()
    index = PrefixIndex(1000, 30.0, clock)
    index.record(A, SHARED)
    clock.advance(20.0)
    index.record(B, SHARED)
    assert index.match(SHARED) == {A: 10, B: 10}
    clock.advance(15.0)  # A's record is 35 s old, B's 15 s
    assert index.match(SHARED) == {B: 10}
    assert index.holds(B, SHARED[-1], clock() - 16.0)
    assert not index.holds(B, SHARED[-1], clock() - 14.0)
    assert not index.holds(C, SHARED[-1], 0.0)


@pytest.mark.parametrize("layout", LAYOUTS, ids=["exact", "default", "3+5"])
def test_a_record_leaves_the_keys_recorded_within_refresh_as_they_were(
        layout: KeyLayout) -> None:
    """Keys the current generation got less than ``refresh_s`` ago keep their stamp; the rest
    of the chain, and keys recorded longer ago, are written with the new one."""
    clock = FakeClock()
    index = PrefixIndex(10_000, 10.0, clock, refresh_s=1.0, layout=layout)
    long = chain("s" * 4 * 30)
    index.record(A, long[:12])  # at 1000.0
    index.record(B, long[:12])
    clock.advance(0.5)
    index.record(A, long)  # the first 12 blocks' keys are fresh: kept at 1000.0
    clock.advance(1.0)
    index.record(B, long)  # 1.5 s after: every key written at 1001.5
    clock.advance(8.7)  # 1010.2: the stamps of 1000.0 are stale, those of 1000.5 on are not
    assert index.match(long) == {B: 30}
    assert index.holds(A, long[-1], clock() - 10.0)  # A's tail, written at 1000.5, is held


@pytest.mark.parametrize("layout", LAYOUTS, ids=["exact", "default", "3+5"])
@pytest.mark.parametrize("seed", range(10))
def test_a_records_guess_of_what_was_held_changes_nothing_it_writes(
        seed: int, layout: KeyLayout) -> None:
    """The ``held`` guess only orders the search for the keys to leave alone: two indexes
    given the same records, one with no guess and one with a random one, hold the same."""
    rng, clock = random.Random(seed), FakeClock()
    plain, guided = (PrefixIndex(400, 5.0, clock, refresh_s=1.0, layout=layout)
                     for _ in range(2))
    texts = [c * 4 * 40 for c in "abc"]
    chains = [chain(t[:4 * n] + "x" * 4 * rng.randrange(0, 6))
              for t in texts for n in (3, 10, 17, 25, 40)]
    for _ in range(200):
        url, hashes = rng.choice([A, B, C]), rng.choice(chains)
        plain.record(url, hashes)
        guided.record(url, hashes, held=rng.randrange(0, len(hashes) + 3))
        clock.advance(rng.choice([0.0, 0.3, 0.7, 1.2]))
        assert plain.held_blocks() == guided.held_blocks() and len(plain) == len(guided)
        assert all(plain.match(q) == guided.match(q) for q in chains[::4])


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
    assert len(index) <= cap
    assert cap // 2 <= sum(index.held_blocks().values()) <= cap  # two generations of ≤ cap / 2
    last = tuple(range((total - batch) * 7919 + 1, total * 7919 + 1, 7919))
    assert index.match(last) == {endpoints[(total // batch - 1) % 8]: batch}
    print(f"\nprefix index: {len(index)} entries for {cap} blocks after {total} blocks: "
          f"{used[total] / len(index):.0f} B/entry, peak {peak / 2**20:.1f} MiB")
    assert used[total] < used[total // 4] * 1.05  # 4× the blocks, no more memory
    assert used[total] < len(index) * 300  # bytes per entry, with room for allocator overhead


def test_entries_to_remember_worked_numbers() -> None:
    from routing.prefix_index import entries_to_remember

    # 8 engines of 426,788 tokens in 16-token blocks: ⌈426,788 / 16⌉ = 26,675 blocks each
    assert entries_to_remember([426_788] * 8, 16) == 2 * 8 * 26_675 == 426_800
    assert entries_to_remember([], 16) == 0
    assert entries_to_remember([15, 16, 17], 16) == 2 * (1 + 1 + 2)


def test_entries_to_remember_sent_worked_numbers() -> None:
    from routing.prefix_index import entries_to_remember_sent

    # 8 engines of 207,061 tokens in 16-token blocks: ⌈207,061 / 16⌉ = 12,942 blocks each
    assert entries_to_remember_sent([207_061] * 8, 16) == 2 * 2 * 8 * 12_942 == 414_144
    assert entries_to_remember_sent([], 16) == 0


def _chain(request: int, blocks: int) -> tuple[int, ...]:
    """``blocks`` block hashes of their own for request number ``request``."""
    return tuple(request * 1_000_000 + i for i in range(blocks))


def _kept_while_running(max_entries: int, engine_blocks: int, endpoints: int) -> int:
    """The match left for a request still running on endpoint "0" after the engines' caches
    turned over twice around it: every endpoint gets 2 × ``engine_blocks`` blocks of other
    requests (100-block prompts) while the long one's chain stays pinned in its engine."""
    clock = FakeClock()
    index = PrefixIndex(max_entries, 1e9, clock)
    running = _chain(1, 400)  # a long request recorded when sent, still decoding
    index.record("0", running)
    others = iter(range(2, 10**6))
    for _ in range(2 * engine_blocks // 100):
        for ep in range(endpoints):
            clock.advance(0.01)
            index.record(str(ep), _chain(next(others), 100))
    return index.match(running, ["0"]).get("0", 0)


def test_an_index_of_what_was_sent_keeps_a_running_requests_chain_through_a_turnover() -> None:
    from routing.prefix_index import entries_to_remember, entries_to_remember_sent

    tokens, endpoints = 16 * 2_000, 4  # engines of 2,000 blocks
    sent = entries_to_remember_sent([tokens] * endpoints, 16)
    assert _kept_while_running(sent, 2_000, endpoints) == 400
    # sized for what the engines report holding, the chain is gone though its engine holds it
    assert _kept_while_running(entries_to_remember([tokens] * endpoints, 16), 2_000,
                               endpoints) == 0


def test_held_blocks_counts_each_endpoints_distinct_fresh_blocks_once() -> None:
    clock = FakeClock()
    index = PrefixIndex(40, 30.0, clock)  # generations of 20 entries
    partial = chain("s" * 12 + "q" * 12)  # SHARED's first 3 blocks, then 3 of its own
    index.record(A, SHARED)
    index.record(A, partial)
    index.record(B, partial)
    assert index.held_blocks() == {A: 13, B: 6}  # shared blocks count once per endpoint
    index.record(C, chain("z" * 40))  # past 20: a new generation; A and B's are the previous
    index.record(A, SHARED)  # in both generations now: still once
    assert index.held_blocks() == {A: 13, B: 6, C: 10}
    clock.advance(20.0)
    index.record(B, chain("w" * 16))
    clock.advance(15.0)  # only B's last record is younger than 30 s
    assert index.held_blocks() == {B: 4}
