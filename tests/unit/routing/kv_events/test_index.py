"""The precise prefix index: engine KV events re-hashed into the router's block hashes."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from routing.features import token_block_hashes
from routing.kv_events.events import AllCleared, BlocksRemoved, BlocksStored
from routing.kv_events.index import KvEventIndex

URL, OTHER = "http://a", "http://b"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def engine_blocks(ids: list[int], size: int) -> list[bytes]:
    """Stand-in engine hashes: the prefix itself (any stable per-prefix key works)."""
    return [repr(ids[:end]).encode() for end in range(size, len(ids) + 1, size)]


def store(ids: list[int], size: int, first: int = 0, count: int | None = None,
          medium: str | None = "GPU") -> BlocksStored:
    names = engine_blocks(ids, size)
    count = len(names) - first if count is None else count
    parent = names[first - 1] if first else None
    return BlocksStored(names[first:first + count], parent,
                        ids[first * size:(first + count) * size], size, medium)


def index(**kw: object) -> KvEventIndex:
    idx = KvEventIndex(block_tokens=2, max_blocks=kw.pop("max_blocks", 10_000), **kw)  # type: ignore[arg-type]
    idx.follow(URL, ["m"])
    return idx


PROMPT = list(range(1, 17))  # 16 tokens: 4 engine blocks of 4, 8 router blocks of 2


def test_stored_blocks_match_the_requests_own_hashes() -> None:
    idx = index()
    idx.apply(URL, [store(PROMPT, 4, 0, 2)])  # the first 8 tokens
    request = token_block_hashes(PROMPT + [99, 98, 97], 2, "m")
    assert idx.match(request, [URL, OTHER]) == {URL: 4}
    assert len(idx) == 4 and idx.held_blocks() == {URL: 4}
    other_model = token_block_hashes(PROMPT, 2, "n")
    assert idx.match(other_model, [URL]) == {}


def test_a_chain_continues_from_its_parent_and_an_unknown_parent_is_skipped() -> None:
    idx = index()
    idx.apply(URL, [store(PROMPT, 4, 2, 2)])  # parent never stored: cannot be placed
    assert len(idx) == 0
    idx.apply(URL, [store(PROMPT, 4, 0, 2), store(PROMPT, 4, 2, 2)])
    assert idx.match(token_block_hashes(PROMPT, 2, "m"), [URL]) == {URL: 8}


def test_removal_and_media() -> None:
    idx = index()
    idx.apply(URL, [store(PROMPT, 4), store(PROMPT, 4, 2, 2, medium="CPU")])
    names = engine_blocks(PROMPT, 4)
    request = token_block_hashes(PROMPT, 2, "m")
    idx.apply(URL, [BlocksRemoved(names[2:], "GPU")])  # blocks 2, 3 still in the host tier
    assert idx.match(request, [URL]) == {URL: 8}
    idx.apply(URL, [BlocksRemoved(names[3:], "CPU")])
    assert idx.match(request, [URL]) == {URL: 6}
    idx.apply(URL, [BlocksRemoved(names[1:3], None), BlocksRemoved(names[2:3], "CPU")])
    assert idx.match(request, [URL]) == {URL: 2}
    assert len(idx) == 2
    idx.apply(URL, [BlocksRemoved([b"never stored"], "GPU")])
    assert len(idx) == 2


def test_a_tier_copy_without_tokens_keeps_a_known_block() -> None:
    """vLLM's CPU offloading announces its copies as hash-only stores (block size 0)."""
    idx = index()
    names = engine_blocks(PROMPT, 4)
    idx.apply(URL, [store(PROMPT, 4), BlocksStored(names[3:] + [b"unknown"], None, [], 0, "CPU")])
    request = token_block_hashes(PROMPT, 2, "m")
    idx.apply(URL, [BlocksRemoved(names[3:], "GPU")])
    assert idx.match(request, [URL]) == {URL: 8}  # still in the host tier
    idx.apply(URL, [BlocksRemoved(names[3:], "CPU")])
    assert idx.match(request, [URL]) == {URL: 6}
    assert idx.dropped == 0


def test_a_match_reaching_into_the_host_tier_is_priced() -> None:
    idx = KvEventIndex(block_tokens=2, max_blocks=1000)
    idx.follow(URL, ["m"], reload_ratio=0.25)
    names = engine_blocks(PROMPT, 4)
    request = token_block_hashes(PROMPT, 2, "m")
    idx.apply(URL, [store(PROMPT, 4), BlocksStored(names, None, [], 0, "CPU")])
    assert idx.match_tiers(request, [URL]) == ({URL: 8}, {})  # all on the device
    idx.apply(URL, [BlocksRemoved(names[2:], "GPU")])  # blocks 2, 3: host tier only
    assert idx.match_tiers(request, [URL]) == ({URL: 8}, {URL: 4 * 2 * 0.25})
    idx.apply(URL, [BlocksRemoved(names[:2], "GPU")])
    assert idx.match_tiers(request, [URL]) == ({URL: 8}, {URL: 8 * 2 * 0.25})
    idx.apply(URL, [BlocksRemoved(names, "CPU")])
    assert idx.match_tiers(request, [URL]) == ({}, {}) and len(idx) == 0
    idx.follow(URL, ["m"])  # no ratio (no facts): host blocks count as held, unpriced
    idx.apply(URL, [store(PROMPT, 4, medium="CPU")])
    assert idx.match_tiers(request, [URL]) == ({URL: 8}, {})


def test_clear_reset_and_drop() -> None:
    idx = index()
    idx.apply(URL, [store(PROMPT, 4), AllCleared()])
    assert len(idx) == 0 and idx.match(token_block_hashes(PROMPT, 2, "m"), [URL]) == {}
    idx.apply(URL, [store(PROMPT, 4)])
    idx.reset(URL)
    assert len(idx) == 0
    idx.apply(URL, [store(PROMPT, 4)])
    idx.drop(URL)
    assert len(idx) == 0 and not idx.follows(URL)
    idx.apply(URL, [store(PROMPT, 4)])  # not followed: ignored
    assert len(idx) == 0


def test_following_again_keeps_the_blocks_unless_the_models_changed() -> None:
    idx = index()
    idx.apply(URL, [store(PROMPT, 4)])
    idx.follow(URL, ["m"])
    assert len(idx) == 8
    idx.follow(URL, ["m", "alias"])
    assert len(idx) == 0 and idx.follows(URL)


def test_blocks_the_tokens_do_not_name_are_skipped() -> None:
    idx = index()
    lora = BlocksStored(engine_blocks(PROMPT, 4), None, PROMPT, 4, "GPU", plain=False)
    odd = BlocksStored(engine_blocks(PROMPT, 3), None, PROMPT[:15], 3, "GPU")
    idx.apply(URL, [lora, odd])
    assert len(idx) == 0 and idx.dropped == 8 + 5


def test_the_cap_bounds_memory() -> None:
    idx = index(max_blocks=5)
    idx.apply(URL, [store(PROMPT, 4)])
    assert len(idx) == 4 and idx.dropped == 2  # the third engine block would pass the cap


def test_every_model_the_endpoint_serves_matches() -> None:
    idx = KvEventIndex(block_tokens=4, max_blocks=100)
    idx.follow(URL, ["alias-a", "alias-b"])
    idx.apply(URL, [store(PROMPT, 8, 0, 1), store(PROMPT, 8, 1, 1)])
    for model in ("alias-a", "alias-b"):
        assert idx.match(token_block_hashes(PROMPT, 4, model), [URL]) == {URL: 4}
    assert len(idx) == 8


def test_pending_blocks_count_until_the_request_finishes_or_they_age() -> None:
    clock = Clock()
    idx = index(pending_s=30.0, clock=clock)
    request = token_block_hashes(PROMPT, 2, "m")
    idx.placed(URL, request)
    idx.placed(OTHER, request)  # not followed: nothing
    assert idx.match(request, [URL, OTHER]) == {URL: 8}
    idx.apply(URL, [store(PROMPT, 4, 0, 1)])
    idx.finished(URL, request)
    assert idx.match(request, [URL]) == {URL: 2}
    idx.placed(URL, request)
    clock.now += 31
    assert idx.match(request, [URL]) == {URL: 2}


def test_random_streams_agree_with_a_brute_force_engine() -> None:
    """An engine holding random prefixes, evicting leaves first: the index's match equals the
    longest prefix whose every block the engine holds."""
    rng = random.Random(7)
    idx = index()
    prompts = [[rng.randrange(3) for _ in range(4 * rng.randrange(1, 6))] for _ in range(30)]
    held: set[bytes] = set()
    for step in range(400):
        ids = rng.choice(prompts)
        names = engine_blocks(ids, 4)
        if rng.random() < 0.6:
            have = 0
            while have < len(names) and names[have] in held:
                have += 1
            if have < len(names):
                idx.apply(URL, [store(ids, 4, have)])
                held.update(names[have:])
        else:
            leaves = [n for n in held if not any(o != n and o.startswith(n[:-1] + b",")
                                                 for o in held)]
            if leaves:
                gone = rng.choice(leaves)
                held.discard(gone)
                idx.apply(URL, [BlocksRemoved([gone], "GPU")])
        probe = rng.choice(prompts)
        expect = 0
        for name in engine_blocks(probe, 4):
            if name not in held:
                break
            expect += 2
        assert idx.match(token_block_hashes(probe, 2, "m"), [URL]).get(URL, 0) == expect, step


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        KvEventIndex(0, 10)
    with pytest.raises(ValueError):
        KvEventIndex(16, 0)


# -- pages smaller than a router block (SGLang: one token by default) -----------------------------

def paged(**kw: object) -> KvEventIndex:
    """Router blocks of 4 tokens: PROMPT is 4 of them, 16 one-token pages, 8 two-token pages."""
    idx = KvEventIndex(block_tokens=4, max_blocks=kw.pop("max_blocks", 10_000), **kw)  # type: ignore[arg-type]
    idx.follow(URL, ["m"])
    return idx


def page(ids: list[int], size: int, n: int) -> bytes:
    """The engine hash of page ``n`` (pages of ``size`` tokens)."""
    return engine_blocks(ids, size)[n]


@pytest.mark.parametrize("size", [1, 2])
def test_pages_are_accumulated_into_whole_router_blocks(size: int) -> None:
    request = token_block_hashes(PROMPT, 4, "m")
    whole = paged()
    whole.apply(URL, [store(PROMPT, size)])
    assert whole.match(request, [URL]) == {URL: 4} and len(whole) == 4
    assert whole.pages == 16 // size - 4  # the pages that complete no router block
    split = paged()  # the same pages in events cut inside router blocks, as SGLang's nodes are
    cuts = [0, 3 // size, 6 // size, 16 // size]
    split.apply(URL, [store(PROMPT, size, a, b - a) for a, b in pairwise(cuts)])
    assert split.match(request, [URL]) == {URL: 4}
    partial = paged()  # a chain ending inside a router block holds the blocks before it
    partial.apply(URL, [store(PROMPT, size, 0, 6 // size)])
    assert partial.match(request, [URL]) == {URL: 1} and partial.dropped == 0


def test_evicting_one_page_drops_the_router_block_holding_it() -> None:
    idx = paged()
    idx.apply(URL, [store(PROMPT, 1)])
    request = token_block_hashes(PROMPT, 4, "m")
    idx.apply(URL, [BlocksRemoved([page(PROMPT, 1, 15)], "GPU")])  # a tail page
    assert idx.match(request, [URL]) == {URL: 3} and len(idx) == 3
    idx.apply(URL, [BlocksRemoved([page(PROMPT, 1, 9)], "GPU")])  # one inside block 2
    assert idx.match(request[:3], [URL]) == {URL: 2} and len(idx) == 2
    # stored again, the page counts at once for the block it completes with its neighbours
    idx.apply(URL, [BlocksStored([page(PROMPT, 1, 9)], page(PROMPT, 1, 8), PROMPT[9:10], 1,
                                 "GPU")])
    assert idx.match(request, [URL]) == {URL: 3}
    idx.apply(URL, [BlocksRemoved(engine_blocks(PROMPT, 1), "GPU")])
    assert len(idx) == 0 and idx.pages == 0 and idx.memory_bytes() == 0  # all forgotten


def test_a_chain_branching_inside_a_router_block() -> None:
    one, two = PROMPT[:6] + [90, 91], PROMPT[:6] + [80, 81]
    idx = paged()
    idx.apply(URL, [store(one, 1), store(two, 1, 6, 2)])  # two continues one's page 5
    assert idx.match(token_block_hashes(one, 4, "m"), [URL]) == {URL: 2}
    assert idx.match(token_block_hashes(two, 4, "m"), [URL]) == {URL: 2}
    idx.apply(URL, [BlocksRemoved([page(one, 1, 5)], "GPU")])  # shared by both blocks 1
    assert idx.match(token_block_hashes(two, 4, "m"), [URL]) == {URL: 1}
    assert idx.match(token_block_hashes(one, 4, "m"), [URL]) == {URL: 1}
    idx.apply(URL, [BlocksRemoved(engine_blocks(one, 1) + engine_blocks(two, 1)[6:], "GPU")])
    assert len(idx) == 0 and idx.pages == 0


def test_pages_straddling_router_blocks() -> None:
    """Pages of 3 tokens with router blocks of 4: a page may complete one block and start the
    next; losing it loses both."""
    idx = paged()
    idx.apply(URL, [store(PROMPT, 3)])  # 5 pages, 15 tokens: 3 router blocks
    request = token_block_hashes(PROMPT, 4, "m")
    assert idx.match(request, [URL]) == {URL: 3}
    idx.apply(URL, [BlocksRemoved([page(PROMPT, 3, 2)], "GPU")])  # tokens 6..8
    assert idx.match(request, [URL]) == {URL: 1} and len(idx) == 1


def test_pages_in_a_host_tier_are_priced() -> None:
    idx = KvEventIndex(block_tokens=4, max_blocks=1000)
    idx.follow(URL, ["m"], reload_ratio=0.5)
    idx.apply(URL, [store(PROMPT, 1), store(PROMPT, 1, medium="CPU_PINNED")])
    request = token_block_hashes(PROMPT, 4, "m")
    assert idx.match_tiers(request, [URL]) == ({URL: 4}, {})
    idx.apply(URL, [BlocksRemoved([page(PROMPT, 1, 13)], "GPU")])  # block 3: host only
    assert idx.match_tiers(request, [URL]) == ({URL: 4}, {URL: 1 * 4 * 0.5})
    idx.apply(URL, [BlocksRemoved([page(PROMPT, 1, 13)], "CPU_PINNED")])
    assert idx.match_tiers(request, [URL]) == ({URL: 3}, {})


def test_sizes_neither_below_nor_a_multiple_are_skipped_and_the_cap_counts_pages() -> None:
    idx = paged()
    idx.apply(URL, [BlocksStored(engine_blocks(PROMPT, 6), None, PROMPT[:12], 6, "GPU")])
    assert len(idx) == 0 and idx.dropped == 2
    capped = paged(max_blocks=1)  # one router block, and 1 × 4 pages completing none
    capped.apply(URL, [store(PROMPT, 1)])
    assert len(capped) == 1 and capped.pages == 4 and capped.dropped == 1


def test_random_page_streams_agree_with_a_brute_force_engine() -> None:
    """An engine of one-token pages holding random prefixes, evicting leaf pages first as a
    radix cache does: the index's match equals the leading router blocks whose every page the
    engine holds."""
    rng = random.Random(11)
    idx = paged()
    prompts = [[rng.randrange(2) for _ in range(rng.randrange(1, 14))] for _ in range(30)]
    held: set[bytes] = set()
    for step in range(600):
        ids = rng.choice(prompts)
        names = engine_blocks(ids, 1)
        if rng.random() < 0.6:
            have = 0
            while have < len(names) and names[have] in held:
                have += 1
            if have < len(names):
                idx.apply(URL, [store(ids, 1, have)])
                held.update(names[have:])
        else:
            leaves = [n for n in held if not any(o != n and o.startswith(n[:-1] + b",")
                                                 for o in held)]
            if leaves:
                gone = rng.sample(leaves, min(len(leaves), rng.randrange(1, 4)))
                held.difference_update(gone)
                idx.apply(URL, [BlocksRemoved(gone, "GPU")])
        probe = rng.choice(prompts)
        pages = engine_blocks(probe, 1)
        expect = 0
        while 4 * (expect + 1) <= len(pages) and set(pages[:4 * (expect + 1)]) <= held:
            expect += 1
        assert idx.match(token_block_hashes(probe, 4, "m"), [URL]).get(URL, 0) == expect, step
