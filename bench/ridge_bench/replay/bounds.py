"""What a prefix cache could at best serve of a trace: the bounds a fleet's hit rate is read
against (in tokens served from cache ÷ prompt tokens, the engines' own hit-rate definition).

- :func:`unlimited_bound`: one cache of unlimited capacity shared by the whole fleet (no
  eviction, every request sees every earlier prompt). A request's cached tokens are its longest
  prefix shared with any earlier prompt: where the two prompts' hash ids agree up to block
  ``d``, they share ``min(d · block_tokens, both lengths)`` tokens (the replay's texts,
  :class:`ridge_bench.replay.trace.BlockTexts`, make the partial last block a prefix of the
  full one), rounded down to whole engine blocks of ``engine_block`` tokens, and never the
  prompt's last token (an engine computes it even when all of the prompt is cached).
  A trie of hash-id paths holding the longest prompt that went through each node gives it in
  O(blocks) per request.
- :func:`lru_bound`: one shared cache of ``capacity_tokens`` that evicts the least recently used
  trace block, counting a hit in whole trace blocks (the prefix of blocks still held, the
  partial last block as its own tokens), rounded as above. The figure of "one LRU cache
  holding all the replicas' KV": what routing alone can reach with that much memory; never
  above the unlimited bound.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ridge_bench.replay.trace import BLOCK_TOKENS, TraceEntry

ENGINE_BLOCK_TOKENS = 16
"""[tokens] vLLM's and the simulator's default KV block on a GPU."""


@dataclass
class _Node:
    longest: int = 0  # [tokens] the longest prompt that went through this node
    children: dict[int, _Node] = field(default_factory=dict)


def unlimited_bound(entries: Iterable[TraceEntry], block_tokens: int = BLOCK_TOKENS,
                    engine_block: int = ENGINE_BLOCK_TOKENS) -> float:
    """The hit rate of an unlimited shared cache (module docstring); 0 for no tokens."""
    root, hits, total = _Node(), 0, 0
    for e in entries:
        shared = _shared(root, e, block_tokens)
        hits += min(shared // engine_block * engine_block, max(0, e.input_length - 1))
        total += e.input_length
        _insert(root, e)
    return hits / total if total else 0.0


def _shared(root: _Node, entry: TraceEntry, block_tokens: int) -> int:
    node, depth = root, 0
    for hash_id in entry.hash_ids:
        child = node.children.get(hash_id)
        if child is None:
            break
        node, depth = child, depth + 1
    if depth == 0:
        return 0
    return min(depth * block_tokens, node.longest, entry.input_length)


def _insert(root: _Node, entry: TraceEntry) -> None:
    node = root
    for hash_id in entry.hash_ids:
        node = node.children.setdefault(hash_id, _Node())
        node.longest = max(node.longest, entry.input_length)


def lru_bound(entries: Iterable[TraceEntry], capacity_tokens: int,
              block_tokens: int = BLOCK_TOKENS,
              engine_block: int = ENGINE_BLOCK_TOKENS) -> float:
    """The hit rate of one LRU cache of ``capacity_tokens`` (module docstring)."""
    if capacity_tokens < block_tokens:
        raise ValueError("the capacity must hold at least one block")
    held: OrderedDict[int, int] = OrderedDict()  # hash id -> its tokens held, LRU first
    used = hits = total = 0
    for e in entries:
        sizes = _block_sizes(e, block_tokens)
        held_tokens = _held_prefix(held, e.hash_ids, sizes)
        hits += min(held_tokens // engine_block * engine_block, max(0, e.input_length - 1))
        for hash_id, size in zip(e.hash_ids, sizes, strict=False):
            old = held.pop(hash_id, 0)
            held[hash_id] = max(size, old)  # re-inserted last: the most recently used
            used += held[hash_id] - old
        total += e.input_length
        while used > capacity_tokens:
            used -= held.popitem(last=False)[1]
    return hits / total if total else 0.0


def _held_prefix(held: OrderedDict[int, int], ids: Iterable[int], sizes: list[int]) -> int:
    """Tokens of the leading blocks still held (a block held in part ends the prefix)."""
    hits = 0
    for hash_id, size in zip(ids, sizes, strict=False):
        have = held.get(hash_id, 0)
        hits += min(size, have)
        if have < size:
            break
    return hits


def _block_sizes(entry: TraceEntry, block_tokens: int) -> list[int]:
    """Tokens of each of the entry's blocks: whole ones, the last the remainder."""
    n = len(entry.hash_ids)
    return [min(block_tokens, entry.input_length - i * block_tokens) for i in range(n)]
