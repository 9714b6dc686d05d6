"""The precise prefix index: engine KV events re-hashed into the router's block hashes."""

from __future__ import annotations

import random

import pytest

from routing.features import token_block_hashes
from routing.kv_event_index import KvEventIndex
from routing.kv_events import AllCleared, BlocksRemoved, BlocksStored

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
