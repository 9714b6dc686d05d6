"""The block pool: allocation, sharing by prefix, LRU eviction."""

from __future__ import annotations

import pytest

from backends.sim.kvcache import (
    BlockPool,
    HostTier,
    chain_hashes,
    host_tier_blocks,
    reload_seconds,
)
from backends.sim.tokens import stream_tokens


def test_chained_hashes_depend_on_every_earlier_block() -> None:
    a = chain_hashes(stream_tokens("A" * 64 + "B" * 64), 4, 0, 0)
    b = chain_hashes(stream_tokens("A" * 64 + "C" * 64), 4, 0, 0)
    c = chain_hashes(stream_tokens("Z" * 64 + "B" * 64), 4, 0, 0)
    assert len(a) == 8
    assert a[:4] == b[:4] and a[4:] != b[4:]
    assert a[4:] != c[4:]  # same block text, different history
    # incremental extension gives the same chain
    assert a[:3] + chain_hashes(stream_tokens("A" * 64 + "B" * 64), 4, 3, a[2]) == a


def test_only_full_blocks_are_hashed() -> None:
    assert len(chain_hashes(stream_tokens("x" * 4 * 10), 4, 0, 0)) == 2


def test_match_take_release_and_lru_eviction() -> None:
    pool = BlockPool(num_blocks=4, block_size=2, caching=True)
    first = pool.allocate(2)
    assert first is not None and pool.num_free == 2 and pool.usage == 0.5
    pool.name(first[0], 111)
    pool.name(first[1], 222)
    pool.release(first)
    assert pool.num_free == 4 and pool.usage == 0.0
    # both blocks still cached while free
    assert pool.match([111, 222, 333], limit_tokens=10) == first
    # the limit caps the match at whole blocks
    assert pool.match([111, 222], limit_tokens=3) == first[:1]
    # a new allocation takes never-used blocks first, then the least recently freed (the tail
    # block, freed first), keeping the head block's name longest
    fresh = pool.allocate(3)
    assert fresh is not None
    assert pool.match([111, 222], limit_tokens=10) == first[:1]


def test_shared_blocks_are_counted_once_and_freed_by_the_last_holder() -> None:
    pool = BlockPool(num_blocks=3, block_size=1, caching=True)
    blocks = pool.allocate(1)
    assert blocks is not None
    pool.name(blocks[0], 9)
    hit = pool.match([9], limit_tokens=5)
    pool.take(hit)
    assert pool.num_free == 2
    pool.release(blocks)
    assert pool.num_free == 2  # still held by the second request
    pool.release(hit)
    assert pool.num_free == 3


def test_allocation_fails_when_full_and_caching_off_never_matches() -> None:
    pool = BlockPool(num_blocks=2, block_size=16, caching=False)
    blocks = pool.allocate(2)
    assert blocks is not None
    assert pool.allocate(1) is None
    pool.name(blocks[0], 5)
    pool.release(blocks)
    assert pool.match([5], limit_tokens=100) == []
    assert pool.blocks_for(33) == 3


def test_fits_says_whether_take_then_allocate_succeeds_and_changes_nothing() -> None:
    pool = BlockPool(num_blocks=4, block_size=1, caching=True)
    held = pool.allocate(3)
    assert held is not None
    pool.name(held[0], 7)
    pool.release(held[:1])  # block 0 free but cached; blocks 1, 2 held
    hit = pool.match([7], limit_tokens=5)
    assert hit == held[:1] and pool.num_free == 2
    assert pool.fits(hit, 1) and not pool.fits(hit, 2)  # taking the hit uses a free block
    assert pool.fits([], 2) and pool.num_free == 2
    pool.take(hit)
    assert pool.allocate(1) is not None and pool.allocate(1) is None


# -- the host tier ------------------------------------------------------------------------------


def test_reload_time_and_host_capacity_worked_numbers() -> None:
    # 12,288 tokens of Llama-3-8B KV (131,072 B/token, bf16) over PCIe Gen4 x16 (25 GB/s)
    assert reload_seconds(12_288, 131_072, 25e9) == pytest.approx(0.0644245, rel=1e-6)
    # 64 GB of host memory in 16-token blocks: bf16, then fp8 (65,536 B/token)
    assert host_tier_blocks(64e9, 131_072, 16) == 30_517
    assert host_tier_blocks(64e9, 65_536, 16) == 61_035


def _evicted_to_host(host_blocks: int) -> tuple[BlockPool, list[int]]:
    """A 2-block device whose first prefix (names 1, 2) was evicted by a second one (3, 4)."""
    pool = BlockPool(num_blocks=2, block_size=4, caching=True, host_blocks=host_blocks)
    for names in ((1, 2), (3, 4)):
        blocks = pool.allocate(2)
        assert blocks is not None
        for b, h in zip(blocks, names, strict=True):
            pool.name(b, h)
        pool.release(blocks)
    return pool, [1, 2]


def test_an_evicted_prefix_is_reloaded_from_the_host_tier() -> None:
    pool, first = _evicted_to_host(host_blocks=8)
    assert pool.host_used_blocks == 4 and pool.host_capacity_blocks == 8  # write-through
    blocks = pool.match(first + [99], limit_tokens=100)
    assert len(blocks) == 2  # both found again, no longer on the device before the match
    assert pool.take_reloaded_tokens() == 8 and pool.take_reloaded_tokens() == 0
    pool.take(blocks)
    assert pool.claim_reloaded(blocks) == 2 and pool.claim_reloaded(blocks) == 0
    # now device-resident: a second match reloads nothing
    pool.release(blocks)
    assert pool.match(first, limit_tokens=100) == blocks
    assert pool.take_reloaded_tokens() == 0


def test_without_a_host_tier_the_evicted_prefix_is_gone() -> None:
    pool, first = _evicted_to_host(host_blocks=0)
    assert pool.match(first, limit_tokens=100) == []
    assert pool.host is None and pool.host_used_blocks == 0


def test_the_host_tier_keeps_only_its_most_recent_blocks() -> None:
    pool, first = _evicted_to_host(host_blocks=2)  # 1, 2 stored, then pushed out by 3, 4
    assert pool.match(first, limit_tokens=100) == []
    tier = HostTier(2)
    for name in (1, 2, 1, 3):  # 1 is refreshed, so 2 is the least recent
        tier.store(name)
    assert 1 in tier and 3 in tier and 2 not in tier and len(tier) == 2


def test_a_reload_stops_where_the_device_has_no_free_block() -> None:
    pool, first = _evicted_to_host(host_blocks=8)
    held = pool.allocate(1)  # one of the two device blocks is in use
    assert held is not None
    blocks = pool.match(first, limit_tokens=100)
    assert len(blocks) == 1 and pool.take_reloaded_tokens() == 4
    assert pool.num_free == 1  # the reloaded block is cached and free until taken


def test_a_reload_never_evicts_the_blocks_it_extends() -> None:
    pool = BlockPool(num_blocks=2, block_size=1, caching=True, host_blocks=8)
    a = pool.allocate(2)
    assert a is not None and pool.host is not None
    pool.name(a[0], 1)
    pool.name(a[1], 9)
    pool.release([a[0]])
    pool.release([a[1]])  # free queue: 1's block first, the next to be evicted
    pool.host.store(2)  # the prefix's second block is only in the host tier
    blocks = pool.match([1, 2], limit_tokens=10)
    # the reload took 9's block, not the matched head's
    assert blocks == [a[0], a[1]]
    assert pool.take_reloaded_tokens() == 1
    assert pool.match([1, 2], limit_tokens=10) == blocks and pool.take_reloaded_tokens() == 0


def test_a_reload_fills_a_gap_before_a_block_the_device_still_holds() -> None:
    pool = BlockPool(num_blocks=2, block_size=1, caching=True, host_blocks=8)
    a = pool.allocate(2)
    assert a is not None
    pool.name(a[0], 1)
    pool.name(a[1], 2)
    pool.release([a[0]])
    pool.release([a[1]])  # free queue: 1's block first
    evictor = pool.allocate(1)
    assert evictor == [a[0]]  # the chain's head is now only in the host tier
    pool.release(evictor)
    # the head is reloaded into the one free block; the device's second block is kept
    assert pool.match([1, 2], limit_tokens=10) == [a[0], a[1]]
    assert pool.take_reloaded_tokens() == 1
