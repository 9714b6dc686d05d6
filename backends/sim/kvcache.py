"""The KV cache: a pool of fixed-size blocks with optional prefix caching.

:class:`BlockPool` follows vLLM's block manager (SGLang's radix cache is the same with one-token
pages): ``num_blocks`` blocks of ``block_size`` tokens, shared between requests by reference
count; a *full* block is named by a chained hash (:func:`chain_hashes`), so a request reuses
the leading blocks whose names the cache holds (never its last token); freed blocks keep their
name on an LRU free queue and are evicted only when reused. Usage counts held blocks only.

With ``host_blocks`` > 0 a write-through host tier (:class:`HostTier`, LRU) keeps copies of
named blocks; a prefix match continues into it, and those blocks are reloaded (the caller
charges :func:`reload_seconds`) instead of recomputed. Once :meth:`BlockPool.record_changes` is
called, every name gained or dropped on either tier is recorded (:class:`Named`,
:class:`Dropped`, :class:`HostStored`, :class:`HostDropped`) for the KV-cache events.
See docs/simulator.md#the-kv-cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import KeysView, Sequence
from dataclasses import dataclass
from itertools import takewhile


@dataclass(frozen=True, slots=True)
class Named:
    """The device cache now holds ``block_hash``: block ``index`` of ``owner``'s chain (the
    request whose tokens fill it; None when the caller did not say)."""

    block_hash: int
    owner: object | None
    index: int


@dataclass(frozen=True, slots=True)
class Dropped:
    """The device cache evicted ``block_hash``."""

    block_hash: int


@dataclass(frozen=True, slots=True)
class HostStored:
    """The host tier now holds ``block_hash``."""

    block_hash: int


@dataclass(frozen=True, slots=True)
class HostDropped:
    """The host tier dropped ``block_hash`` (its least recently used block, to make room)."""

    block_hash: int


CacheChange = Named | Dropped | HostStored | HostDropped


def reload_seconds(tokens: int, kv_bytes_per_token: float, host_link_bandwidth: float) -> float:
    """Time to copy ``tokens`` tokens of KV from host memory to the device [s]
    = tokens · KV bytes per token [B/token] ÷ host link bandwidth [B/s]."""
    return tokens * kv_bytes_per_token / host_link_bandwidth


def host_tier_blocks(host_bytes: float, kv_bytes_per_token: float, block_size: int) -> int:
    """Blocks a host tier of ``host_bytes`` [B] holds = ⌊bytes ÷ (KV bytes per token [B/token]
    · block size [tokens])⌋ (host blocks store the device's KV, same dtype, same block)."""
    return int(host_bytes // (kv_bytes_per_token * block_size))


class HostTier:
    """The host tier: names of prefix blocks, least recently stored or hit first (LRU), at
    most ``capacity`` of them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a host tier holds at least one block")
        self.capacity = capacity
        self._names: OrderedDict[int, None] = OrderedDict()
        self.changes: list[CacheChange] | None = None
        """Where new and dropped names are recorded (None: not recorded)."""

    def __contains__(self, name: int) -> bool:
        return name in self._names

    def __len__(self) -> int:
        return len(self._names)

    def names(self) -> KeysView[int]:
        """The names held (a live view)."""
        return self._names.keys()

    def store(self, name: int) -> None:
        """Hold ``name`` as the most recently used block, dropping the least recent if full."""
        names = self._names
        if name in names:
            names.move_to_end(name)
            return
        names[name] = None
        changes = self.changes
        if changes is not None:
            changes.append(HostStored(name))
        if len(names) > self.capacity:
            dropped, _ = names.popitem(last=False)
            if changes is not None:
                changes.append(HostDropped(dropped))


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

    def __init__(self, num_blocks: int, block_size: int, caching: bool,
                 host_blocks: int = 0) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.host = HostTier(host_blocks) if caching and host_blocks > 0 else None
        self._ref = [0] * num_blocks
        self._name: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict()
        self._fresh = 0  # blocks [_fresh, num_blocks) were never used: they head the free queue
        self._reloaded: set[int] = set()  # device blocks loaded from the host tier, unclaimed
        self._reload_tokens = 0  # tokens reloaded since take_reloaded_tokens last ran
        self._changes: list[CacheChange] | None = None  # recorded changes (module docstring)

    def record_changes(self) -> None:
        """Record the cache's changes from now on (module docstring)."""
        if self._changes is None:
            self._start_changes()

    def take_changes(self) -> list[CacheChange]:
        """The changes recorded since the last call, oldest first."""
        taken = self._changes
        if not taken:
            return []
        self._start_changes()
        return taken

    def _start_changes(self) -> None:
        self._changes = []
        if self.host is not None:
            self.host.changes = self._changes  # one list: device and host changes in order

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

    def match(self, hashes: Sequence[int], limit_tokens: int,
              owner: object | None = None) -> list[int]:
        """The cached blocks for the longest prefix of ``hashes``, covering at most
        ``limit_tokens`` tokens. Does not take them: see :meth:`take`. ``owner``: the request
        whose chain ``hashes`` is (blocks reloaded from the host tier are its)."""
        if not self.caching:
            return []
        run = hashes[: limit_tokens // self.block_size]
        cached = self._cached
        found = list(map(cached.__getitem__, takewhile(cached.__contains__, run)))
        if self.host is None:
            return found
        for h in run[: len(found)]:
            self.host.store(h)  # a hit refreshes the host copy too
        return self._reload(found, run[len(found):], owner)

    def _reload(self, found: list[int], rest: Sequence[int], owner: object | None) -> list[int]:
        """``found`` extended by the blocks of ``rest`` the host tier (or, past a gap, the
        device) holds, each host block reloaded into a fresh device block while any is free."""
        host = self.host
        assert host is not None
        wanted = list(takewhile(lambda h: h in host or h in self._cached, rest))
        if not wanted:
            return found
        on_device = [self._cached.get(h) for h in wanted]
        kept = [b for b in on_device if b is not None]
        self.take(found + kept)  # the reloads' allocation must not evict the match's blocks
        fresh = iter(self.allocate(min(on_device.count(None), self.num_free)) or [])
        blocks, cut = list(found), None
        for i, (h, block) in enumerate(zip(wanted, on_device, strict=True), len(found)):
            if block is None:
                block = next(fresh, None)
                if block is None:
                    cut = len(blocks) if cut is None else cut
                    continue
                self._cached[h], self._name[block] = block, h
                if self._changes is not None:
                    self._changes.append(Named(h, owner, i))
                self._reloaded.add(block)
                self._reload_tokens += self.block_size
                host.store(h)
            blocks.append(block)
        self.release(blocks)  # held again by the caller's take, as any match
        return blocks if cut is None else blocks[:cut]

    def take_reloaded_tokens(self) -> int:
        """Tokens reloaded from the host tier since the last call (the copies to charge)."""
        tokens, self._reload_tokens = self._reload_tokens, 0
        return tokens

    def claim_reloaded(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` were reloaded from the host tier and not claimed yet (a
        request's host hits, counted once); they are claimed."""
        if not self._reloaded:
            return 0
        hit = self._reloaded.intersection(blocks)
        self._reloaded -= hit
        return len(hit)

    def forget_reloaded(self) -> None:
        """Stop tracking unclaimed reloads (they now count as device-cached blocks)."""
        self._reloaded.clear()

    def fits(self, matched: Sequence[int], count: int) -> bool:
        """Whether :meth:`take` of ``matched`` (distinct blocks) then :meth:`allocate` of
        ``count`` would succeed; changes nothing (vLLM checks the free count before it touches
        a block, so an admission that fails leaves the eviction order as it was)."""
        return count <= self.num_free - len(self._free.keys() & matched)

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
            self._reloaded.discard(block)
            name = self._name[block]
            if name is not None:
                self._name[block] = None
                if self._cached.get(name) == block:
                    del self._cached[name]
                    if self._changes is not None:
                        self._changes.append(Dropped(name))
            self._ref[block] = 1
            out.append(block)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Stop holding ``blocks``; the last holder frees them, last block first."""
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def name(self, block: int, block_hash: int, owner: object | None = None,
             index: int = 0) -> None:
        """Record that ``block`` (full, held) now caches the prefix named ``block_hash``:
        block ``index`` of ``owner``'s chain."""
        if not self.caching:
            return
        if block_hash not in self._cached:
            self._cached[block_hash] = block
            self._name[block] = block_hash
            if self._changes is not None:
                self._changes.append(Named(block_hash, owner, index))
        if self.host is not None:
            self.host.store(block_hash)  # write-through

    def cached_blocks(self) -> int:
        """Blocks whose contents are reusable by name."""
        return len(self._cached)

    def cached_names(self) -> KeysView[int]:
        """The names of the blocks whose contents are reusable (a live view)."""
        return self._cached.keys()

    @property
    def host_used_blocks(self) -> int:
        """Blocks the host tier holds (0 without one)."""
        return 0 if self.host is None else len(self.host)

    @property
    def host_capacity_blocks(self) -> int:
        """Blocks the host tier can hold (0 without one)."""
        return 0 if self.host is None else self.host.capacity
