"""The KV cache: a pool of fixed-size blocks with optional prefix caching.

Algorithm (vLLM's block manager; SGLang's radix cache is the same with one-token pages):

* The cache holds ``num_blocks`` blocks of ``block_size`` tokens. A request holds a list of blocks
  (its block table) covering its computed tokens; a block may be shared by several requests
  (``ref`` counts holders).
* Prefix caching: a *full* block is named by a chained hash, h_j = hash(h_{j-1}, text of block j),
  so a block's name depends on every token before it. A request's leading blocks whose names are
  in the cache map are reused instead of recomputed (at most all but its last token: one token is
  always computed so the step can sample).
* Freed blocks keep their contents and name and join the tail of a free queue (a request's blocks
  are freed last-block-first, so its tail is evicted before its head). Allocation takes blocks
  never used yet first, then pops from the head: the least recently freed block is evicted (its
  name dropped) only when reused (LRU).
* Usage = blocks held by requests / all blocks (a free block that still caches a prefix counts as
  free, as in vLLM's ``kv_cache_usage_perc`` and SGLang's ``token_usage``).

Parameters: ``num_blocks`` (blocks), ``block_size`` (tokens per block: 16 for vLLM on GPUs, 128
on its CPU backend, 1 for SGLang's default page size), ``caching`` (prefix caching on or off).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def chain_hashes(tokens: Sequence[str], block_size: int, start: int, parent: int) -> list[int]:
    """Hashes of the full blocks of ``tokens`` from block index ``start`` on, chained from
    ``parent`` (the hash of block ``start - 1``, or 0 for the first block)."""
    hashes: list[int] = []
    for j in range(start, len(tokens) // block_size):
        parent = hash((parent, "".join(tokens[j * block_size : (j + 1) * block_size])))
        hashes.append(parent)
    return hashes


class BlockPool:
    """Blocks, their holders and the prefix-cache map (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self._ref = [0] * num_blocks
        self._name: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict()
        self._fresh = 0  # blocks [_fresh, num_blocks) were never used: they head the free queue

    @property
    def num_free(self) -> int:
        return len(self._free) + self.num_blocks - self._fresh

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, in [0, 1]."""
        return 1.0 - self.num_free / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def match(self, hashes: Sequence[int], limit_tokens: int) -> list[int]:
        """The cached blocks for the longest prefix of ``hashes``, covering at most
        ``limit_tokens`` tokens. Does not take them: see :meth:`take`."""
        if not self.caching:
            return []
        found: list[int] = []
        for h in hashes[: limit_tokens // self.block_size]:
            block = self._cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def take(self, blocks: Sequence[int]) -> None:
        """Become a holder of ``blocks`` (cached blocks found by :meth:`match`)."""
        for b in blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks (evicting the least recently freed); None if too few are free."""
        if count > self.num_free:
            return None
        fresh = min(count, self.num_blocks - self._fresh)
        out = list(range(self._fresh, self._fresh + fresh))
        self._fresh += fresh
        for b in out:
            self._ref[b] = 1
        for _ in range(count - fresh):
            block, _ = self._free.popitem(last=False)
            name = self._name[block]
            if name is not None:
                self._name[block] = None
                if self._cached.get(name) == block:
                    del self._cached[name]
            self._ref[block] = 1
            out.append(block)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Stop holding ``blocks``; the last holder frees them, last block first."""
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def name(self, block: int, block_hash: int) -> None:
        """Record that ``block`` (full, held) now caches the prefix named ``block_hash``."""
        if self.caching and block_hash not in self._cached:
            self._cached[block_hash] = block
            self._name[block] = block_hash

    def cached_blocks(self) -> int:
        """Blocks whose contents are reusable by name."""
        return len(self._cached)
