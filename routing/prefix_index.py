"""Which endpoint recently served which prompt blocks: a bounded, aging prefix index.

:class:`PrefixIndex` maps (block hash, endpoint) → when the block was last recorded there
[s, the injected monotonic clock], in two generations of plain dicts per endpoint (a
generational LRU). Keys (:class:`KeyLayout`): a chain's first :data:`DENSE_BLOCKS` blocks one
by one, then one block in :data:`STRIDE` and the chain's last; :data:`EXACT` keeps every block.

Invariants: hashes are chained and every record writes a chain from block 0, so the blocks of a
request's chain an endpoint holds are a prefix and ``match`` is a binary search over the keys
(exact up to ``dense`` blocks and for a chain held whole, else short by less than ``stride``).
The entries never exceed ``max_entries``, counted in blocks (a coarse entry counts
``stride``), and everything recorded in the last half-capacity's worth of records is kept;
entries older than ``max_age_s`` count as absent. Sizing: :func:`entries_to_remember`,
:func:`entries_to_remember_sent`; memory: :data:`BYTES_PER_ENTRY` per entry.

See docs/routing.md#the-prefix-index.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat

DENSE_BLOCKS = 16
"""[blocks] A chain's leading blocks that each get an entry (:class:`KeyLayout`)."""
STRIDE = 4
"""[blocks] Past :data:`DENSE_BLOCKS`, one entry per this many blocks (:class:`KeyLayout`)."""
BYTES_PER_ENTRY = 100
"""[B] Memory per (block hash, endpoint) entry, rounded up: a dict slot and the 64-bit int key
(the time stamp is one float shared by a record), plus headroom for a dict's growth (what was
measured: docs/routing.md#the-prefix-index)."""


def entries_to_remember(engine_tokens: Iterable[int], block_tokens: int) -> int:
    """The cap [(block, endpoint) pairs] for the index to keep every block the engines can
    hold: 2 × Σ ⌈tokens ÷ block_tokens⌉ over the endpoints (each engine's KV capacity
    [tokens]). Worked: 8 engines of 426,788 tokens in 16-token blocks: 2 × 8 × 26,675 =
    426,800."""
    if block_tokens < 1:
        raise ValueError("block_tokens must be positive")
    return 2 * sum(-(-max(0, t) // block_tokens) for t in engine_tokens)


SENT_HEADROOM = 2
"""[×] How much larger than :func:`entries_to_remember` an index of what was sent must be:
one fleet KV's worth for the requests still running, one for what the engines cache
(docs/routing.md#the-prefix-index, Sizing)."""


def entries_to_remember_sent(engine_tokens: Iterable[int], block_tokens: int) -> int:
    """The cap [(block, endpoint) pairs] for an index of the blocks *sent* to each engine to
    keep every block the engines hold, their running requests' included:
    :data:`SENT_HEADROOM` × :func:`entries_to_remember`. Worked: 8 engines of 207,061 tokens
    in 16-token blocks: 2 × 2 × 8 × 12,942 = 414,144."""
    return SENT_HEADROOM * entries_to_remember(engine_tokens, block_tokens)


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """Which block hashes of a chain the index keeps as entries (docs/routing.md#the-prefix-index).

    ``dense`` [blocks]: the leading blocks kept one by one; ``stride`` [blocks]: past them, one
    entry per ``stride`` blocks, plus one for the chain's last block. Every chain of a given
    length has the same key positions, so the held keys of a chain are a prefix of its keys."""

    dense: int = DENSE_BLOCKS
    stride: int = STRIDE

    def __post_init__(self) -> None:
        if self.dense < 1 or self.stride < 1:
            raise ValueError("dense and stride must be positive")

    def keys(self, hashes: Sequence[int]) -> tuple[int, ...]:
        """The entries' hashes of the chain ``hashes``, in chain order."""
        dense, stride = self.dense, self.stride
        if len(hashes) <= dense or stride == 1:
            return tuple(hashes)
        keys = tuple(hashes[:dense]) + tuple(hashes[dense + stride - 1::stride])
        return keys if (len(hashes) - dense) % stride == 0 else keys + (hashes[-1],)

    def count(self, blocks: int) -> int:
        """How many keys a chain of ``blocks`` blocks has."""
        over = blocks - self.dense
        return blocks if over <= 0 else self.dense - (-over // self.stride)

    def blocks(self, held: int, length: int) -> int:
        """The blocks the first ``held`` keys of a chain of ``length`` blocks stand for."""
        if held <= self.dense:
            return held
        if held >= self.count(length):
            return length
        return self.dense + (held - self.dense) * self.stride

    def first_key(self, block: int, length: int) -> int:
        """The index of the first key of a chain of ``length`` blocks at block ``block`` or
        past it (the key count when there is none)."""
        if block >= length:
            return self.count(length)
        if block <= self.dense:
            return block
        return min(self.dense + (block - self.dense) // self.stride, self.count(length) - 1)


EXACT = KeyLayout(stride=1)
"""Every block an entry: matches count exact blocks (an index whose matches are predictions
that must hold to the block, e.g. the KV-event index's pending blocks)."""


class _Generations:
    """One endpoint's entries: the current and the previous generation, each in two zones
    (the dense keys and the coarse ones, which stand for ``stride`` blocks each)."""

    __slots__ = ("current", "previous", "coarse", "coarse_previous", "requests")

    def __init__(self) -> None:
        self.current: dict[int, float] = {}
        self.previous: dict[int, float] = {}
        self.coarse: dict[int, float] = {}
        self.coarse_previous: dict[int, float] = {}
        self.requests = 0  # chains recorded in the current generation

    def __len__(self) -> int:
        return (len(self.current) + len(self.previous) + len(self.coarse)
                + len(self.coarse_previous))

    def weight(self, stride: int) -> int:
        """The blocks the current generation's entries stand for."""
        return len(self.current) + stride * len(self.coarse)

    def rotate(self) -> None:
        self.previous, self.current = self.current, {}
        self.coarse_previous, self.coarse = self.coarse, {}
        self.requests = 0

    def forget(self, hashes: Sequence[int]) -> None:
        for zone in (self.current, self.previous, self.coarse, self.coarse_previous):
            for h in hashes:
                zone.pop(h, None)


class PrefixIndex:
    """A bounded, aging map of (block hash, endpoint) → last time recorded."""

    __slots__ = ("_max_entries", "_max_age_s", "_refresh_s", "_clock", "_layout", "_maps",
                 "_current", "_recent", "_last", "_hint")

    def __init__(self, max_entries: int, max_age_s: float,
                 clock: Callable[[], float] = time.monotonic, refresh_s: float = 0.0,
                 layout: KeyLayout = KeyLayout()) -> None:
        if max_entries < 1 or max_age_s <= 0:
            raise ValueError("max_entries and max_age_s must be positive")
        self._max_entries = max_entries
        self._max_age_s = max_age_s
        self._refresh_s = refresh_s
        self._clock = clock
        self._layout = layout
        self._maps: dict[str, _Generations] = {}
        self._current = 0  # blocks the current generations stand for, all endpoints together
        self._recent: Counter[str] = Counter()  # requests recorded, both generations
        self._last: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # a chain, its keys
        self._hint = 0  # the last match's key count: the next request's first guess

    def __len__(self) -> int:
        """Entries held, stale ones included (never above ``max_entries``)."""
        return sum(len(g) for g in self._maps.values())

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @property
    def layout(self) -> KeyLayout:
        return self._layout

    def record(self, endpoint: str, hashes: Sequence[int], request: bool = True,
               held: int = 0) -> None:
        """Remember that ``endpoint`` now holds the blocks ``hashes`` (a request's chain);
        ``request``: count it as a request sent there (:meth:`recent_requests`; False for a
        chain recorded again when its request finishes); ``held``: the leading blocks it held
        when last matched, the first guess of the search for the keys recorded a moment ago
        (any value gives the same result; a right one saves look-ups)."""
        half = self._max_entries // 2 or 1
        if len(hashes) > half:
            hashes = hashes[:half]  # a prefix of the chain: still a chain
        layout = self._layout
        keys, dense = self._keys(hashes), layout.dense
        total = len(keys)
        if self._current + (total if total <= dense else
                            dense + layout.stride * (total - dense)) > half:
            self._rotate()
        gens = self._maps.get(endpoint)
        if gens is None:
            gens = self._maps[endpoint] = _Generations()
        if request:
            gens.requests += 1
            self._recent[endpoint] += 1
        current, now = gens.current, self._clock()
        before = gens.weight(layout.stride)
        fresh = 0
        if self._refresh_s:  # the leading keys recorded a moment ago are not written again
            new, coarse = current.get, gens.coarse.get  # the current generation only
            fresh = _held_keys(new, new, coarse, coarse, keys, dense, now - self._refresh_s,
                               layout.first_key(held, len(hashes)), total)
        if fresh < dense:
            current.update(zip(keys[fresh:dense], repeat(now)))
        if total > dense:
            gens.coarse.update(zip(keys[max(fresh, dense):], repeat(now)))
        self._current += gens.weight(layout.stride) - before

    def _keys(self, hashes: Sequence[int]) -> tuple[int, ...]:
        """``layout.keys(hashes)``; the last chain's are kept, as a request's chain is matched
        and then recorded (a tuple only: it cannot have changed in between)."""
        chain, keys = self._last
        if hashes is chain:
            return keys
        keys = self._layout.keys(hashes)
        if type(hashes) is tuple:
            self._last = hashes, keys
        return keys

    def _rotate(self) -> None:
        """Drop every previous generation; the current ones become the previous ones."""
        recent = self._recent
        recent.clear()
        for url, gens in self._maps.items():
            if gens.requests:
                recent[url] = gens.requests  # the generation now previous
            gens.rotate()
        self._current = 0

    def match(self, hashes: Sequence[int],
              endpoints: Iterable[str] | None = None) -> dict[str, int]:
        """Per endpoint (all known, or those of ``endpoints``), how many leading blocks of
        ``hashes`` it probably holds; endpoints with none are left out.

        Per endpoint, over the chain's keys: key 0 first, then the two probes of ``hint``, the
        key count found on the previous endpoint — for the first one, the count the last match
        ended with (prompts are held up to the same boundaries, the end of a shared system
        prompt or of an earlier turn, so it is often exact). When they settle it (its last key
        held, the next one not), that is the count; else a binary search
        (:func:`_held_keys`, whose first probes test the hint again). The probes of the hint
        are written in line, not a call per endpoint: this is the innermost loop of every
        request. The held key count becomes blocks through the layout."""
        if not hashes:
            return {}
        layout = self._layout
        keys, dense, length = self._keys(hashes), layout.dense, len(hashes)
        cutoff = self._clock() - self._max_age_s
        maps = self._maps
        out: dict[str, int] = {}
        hint, known, head, total, blocks = self._hint, -1, keys[0], len(keys), 0
        probe = _hint_probe(keys, dense, hint)
        for url in (maps if endpoints is None else endpoints):
            gens = maps.get(url)
            if gens is None:
                continue
            stamp = gens.current.get(head) or gens.previous.get(head)
            if stamp is None or stamp < cutoff:
                continue
            lo = -1
            if probe is not None:  # the hint's last key held and its next one not: settled
                at, after, coarse = probe
                new, old = (gens.coarse, gens.coarse_previous) if coarse else \
                    (gens.current, gens.previous)
                stamp = new.get(at) or old.get(at)
                if stamp is not None and stamp >= cutoff and (
                        after is None or (stamp := new.get(after) or old.get(after)) is None
                        or stamp < cutoff):
                    lo = hint
            if lo < 0:
                lo = _held_keys(gens.current.get, gens.previous.get, gens.coarse.get,
                                gens.coarse_previous.get, keys, dense, cutoff, hint, total)
            if lo != known:  # the blocks of the previous endpoint's count are known
                if lo != hint:
                    hint, probe = lo, _hint_probe(keys, dense, lo)
                known = lo
                blocks = lo if lo <= dense else layout.blocks(lo, length)
            out[url] = blocks
        self._hint = hint
        return out

    def holds(self, endpoint: str, block: int, since: float) -> bool:
        """Whether ``endpoint``'s current generation holds the key ``block`` (a chain's last
        block is always a key), recorded at ``since`` or later (a block only in the previous
        generation is due to be dropped: not held)."""
        gens = self._maps.get(endpoint)
        if gens is None:
            return False
        stamp = gens.current.get(block) or gens.coarse.get(block)
        return stamp is not None and stamp >= since

    def forget(self, endpoint: str, hashes: Iterable[int]) -> None:
        """Drop the entries of ``hashes`` on ``endpoint`` (absent ones are ignored)."""
        gens = self._maps.get(endpoint)
        if gens is None:
            return
        before = gens.weight(self._layout.stride)
        gens.forget(tuple(hashes))
        self._current -= before - gens.weight(self._layout.stride)

    def forget_endpoint(self, url: str) -> None:
        """Stop matching anything recorded for ``url`` (e.g. it restarted or was removed)."""
        gens = self._maps.pop(url, None)
        self._recent.pop(url, None)
        if gens is not None:
            self._current -= gens.weight(self._layout.stride)

    def footprint(self, endpoint: str) -> int:
        """The blocks ``endpoint``'s entries stand for, both generations, stale ones included:
        how much prompt text was recently sent there [blocks] (a coarse entry counts
        ``stride``; a block in both generations counts twice). O(1)."""
        gens = self._maps.get(endpoint)
        if gens is None:
            return 0
        return (len(gens.current) + len(gens.previous)
                + self._layout.stride * (len(gens.coarse) + len(gens.coarse_previous)))

    def recent_requests(self, endpoint: str) -> int:
        """The requests recorded for ``endpoint`` in both generations: how many were recently
        sent there [requests] (those with at least one prompt block). O(1)."""
        return self._recent[endpoint]

    @property
    def recent_requests_of(self) -> Callable[[str], int]:
        """:meth:`recent_requests` as one lookup in C (a :class:`collections.Counter`'s item,
        0 when absent): what a view calls once per candidate of every new request."""
        return self._recent.__getitem__

    def held_blocks(self) -> dict[str, int]:
        """Per endpoint, the distinct blocks it holds recorded within ``max_age_s`` (endpoints
        with none are left out). A block in both generations counts once; a coarse entry
        counts ``stride`` blocks (a chain's last one may stand for fewer)."""
        fresh = (self._clock() - self._max_age_s).__le__
        stride = self._layout.stride
        out: dict[str, int] = {}
        for url, gens in self._maps.items():
            held = _fresh_count(gens.current, gens.previous, fresh) + \
                stride * _fresh_count(gens.coarse, gens.coarse_previous, fresh)
            if held:
                out[url] = held
        return out

    def clear(self) -> None:
        self._maps.clear()
        self._recent.clear()
        self._current = 0


def _held_keys(current: Stamps, previous: Stamps, coarse: Stamps, coarse_previous: Stamps,
               keys: Sequence[int], dense: int, cutoff: float, hint: int, total: int) -> int:
    """How many of the first ``total`` ``keys`` are held, stamped ``cutoff`` or later: a binary
    search whose first probes test ``hint`` when it is 2 or more (the match looks key 0 up
    before it; a smaller hint searches from nothing). A dense key's stamp is ``current``'s,
    else ``previous``'s; a coarse key's likewise ``coarse``'s, else ``coarse_previous``'s (a
    search of one generation passes each zone's look-up twice). Both look-ups are in line at
    every probe rather than in a helper: this runs for every request."""
    lo, hi = 0, total
    if 1 < hint <= hi:
        k = keys[hint - 1]
        stamp = (current(k) or previous(k)) if hint <= dense else (coarse(k) or coarse_previous(k))
        if stamp is not None and stamp >= cutoff:
            lo = hint
            if hint < hi:
                k = keys[hint]
                stamp = (current(k) or previous(k)) if hint < dense else \
                    (coarse(k) or coarse_previous(k))
                if stamp is not None and stamp >= cutoff:
                    lo = hint + 1
                else:
                    hi = hint
        else:
            hi = hint - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        k = keys[mid - 1]
        stamp = (current(k) or previous(k)) if mid <= dense else (coarse(k) or coarse_previous(k))
        if stamp is not None and stamp >= cutoff:
            lo = mid
        else:
            hi = mid - 1
    return lo


Stamps = Callable[[int], float | None]
"""A zone's look-up: a key's stamp [s], None when absent."""

HintProbe = tuple[int, int | None, bool]
"""The keys :meth:`PrefixIndex.match` probes for a hint of n held keys: key n − 1, key n (None
when the chain has n keys), and whether both are coarse keys (else both are dense ones)."""


def _hint_probe(keys: Sequence[int], dense: int, hint: int) -> HintProbe | None:
    """The probe of ``hint`` held keys, or None when there is none to make in line: a hint of
    0 or 1 (key 0 is looked up first), one past the chain, or one whose two keys lie in
    different zones (the hint at ``dense``)."""
    total = len(keys)
    if hint <= 1 or hint > total or hint == dense:
        return None
    return keys[hint - 1], keys[hint] if hint < total else None, hint > dense


def _fresh_count(current: dict[int, float], previous: dict[int, float],
                 fresh: Callable[[float], bool]) -> int:
    """Distinct keys of the two generations of one zone whose stamp is ``fresh``."""
    held = sum(map(fresh, current.values()))
    if previous:
        older = previous.keys() - current.keys()
        held += sum(map(fresh, map(previous.__getitem__, older)))
    return held
