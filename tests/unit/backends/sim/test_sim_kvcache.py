"""The block pool: allocation, sharing by prefix, LRU eviction."""

from __future__ import annotations

from backends.sim.kvcache import BlockPool, chain_hashes
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
