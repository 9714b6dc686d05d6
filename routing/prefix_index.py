"""Which endpoint recently served which prompt blocks: a bounded, aging prefix index.

Algorithm. Per endpoint, two generations of a plain dict block hash → the time it was last
recorded there: ``current`` and ``previous``. One entry is one (block hash, endpoint); the block
hash itself is the key, so a look-up builds no key object.

- ``record(endpoint, hashes)`` writes the hashes of the request's chain into the endpoint's
  current generation with the record's time (one C-level ``dict.update``), except the
  leading ones the current generation already holds from the last ``refresh_s`` seconds
  (found by binary search: a shared system prompt is not written again by every request).
  O(blocks).
- Because the hashes are chained, block i on an endpoint implies blocks 0..i there. Every
  record writes a whole chain from block 0 and ``forget`` removes only a chain's tail, so in
  each generation the set of a request's blocks an endpoint holds is a prefix, and so is the
  union of the two. ``match(hashes)`` finds its length per endpoint: block 0 first (most
  endpoints hold none of a given prompt), then a binary search: O(endpoints × log blocks)
  look-ups, whose first probes test the length found on the previous endpoint (prompts are
  held up to the same boundaries: often two look-ups settle it).
  Entries older than ``max_age_s`` count as absent.
- Capacity (generational LRU): when a record could bring the current generations of all
  endpoints together past ``max_entries / 2`` entries, every endpoint's previous generation
  is dropped and its current one becomes the previous one (a chain longer than
  ``max_entries / 2`` blocks is recorded up to that length). The index so never holds more
  than ``max_entries`` entries and always keeps everything recorded in the last
  half-capacity's worth of records;
  a block recorded again moves to the current generation, so what is in use stays. Dropping a
  generation costs nothing per entry on the hot path.
- ``holds(endpoint, hash, since)``: the entry is in the current generation, recorded at
  ``since`` or later. Used to skip refreshing a chain whose deepest block was recorded a moment
  ago (then the whole chain is in the current generation, recorded as recently).
- ``forget(endpoint, hashes)`` removes those blocks of one endpoint (a request that was
  recorded when its replica was chosen, then failed: pass the blocks past the match the
  endpoint already had, so the held set stays a prefix). O(blocks).
- ``forget_endpoint(url)`` drops the endpoint's entries in O(1); if the URL comes back it
  starts empty (an engine that restarted has an empty cache).
- ``held_blocks()``: per endpoint, the distinct blocks it holds that count as cached (recorded
  within ``max_age_s``), for the telemetry's working set. O(entries), at C speed: a scrape's
  work, never the request path's.

Sizing (:func:`entries_to_remember`): to remember every block the engines can hold, the
current generation alone must hold them all, so ``max_entries`` = 2 × Σ over endpoints of
⌈engine KV tokens ÷ tokens per block⌉ for an index of what the engines report holding.
An index of what was *sent* (:func:`entries_to_remember_sent`) needs twice that: a request's
blocks are recorded when it is sent, and its engine holds them for its whole run however
many records come after, so besides what the engines cache (one fleet KV) a generation must
hold the chains of the requests still running, recorded up to a run ago (up to another fleet
KV: engines short of KV hold mostly running requests). Measured on the long-session trace
(8 replicas short of KV, ``docs/benchmarks/capacity.md``): at 2 × Σ the generations turned
every 15–20 s at the peak; 44 of 1,331 follow-ups arriving within 60 s went to another replica
and recomputed their history, 30 of them while the parent still ran on its own, and for 40 the
index held only the system prompt there; at 4 × Σ, replayed on the same requests, it held the
history of all 44.
Memory: :data:`BYTES_PER_ENTRY` per entry.

Parameters: ``max_entries`` caps the (hash, endpoint) entries; ``max_age_s`` is how long a
recorded block counts as cached (seconds; engines evict under memory pressure, so an old record
is a guess gone stale); ``refresh_s`` (seconds, default 0: always) how recent a held block
must be not to be written again; ``clock`` returns seconds (monotonic).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

BYTES_PER_ENTRY = 100
"""[B] Memory per (block hash, endpoint) entry, rounded up: 78–83 B measured on CPython 3.11
(a dict slot and the 64-bit int key; the time stamp is one float shared by a record) with
100,000 to 1,000,000 entries, plus headroom for a dict's growth."""


def entries_to_remember(engine_tokens: Iterable[int], block_tokens: int) -> int:
    """Entries [count] for the index to keep every block the engines can hold: 2 × Σ
    ⌈tokens ÷ block_tokens⌉ over the endpoints (each engine's KV capacity [tokens]). Worked: 8
    engines of 426,788 tokens in 16-token blocks: 2 × 8 × 26,675 = 426,800."""
    if block_tokens < 1:
        raise ValueError("block_tokens must be positive")
    return 2 * sum(-(-max(0, t) // block_tokens) for t in engine_tokens)


SENT_HEADROOM = 2
"""[×] How much larger than :func:`entries_to_remember` an index of what was sent must be:
one fleet KV's worth for the requests still running, one for what the engines cache (module
docstring, Sizing)."""


def entries_to_remember_sent(engine_tokens: Iterable[int], block_tokens: int) -> int:
    """Entries [count] for an index of the blocks *sent* to each engine to keep every block
    the engines hold, their running requests' included: :data:`SENT_HEADROOM` ×
    :func:`entries_to_remember`. Worked: 8 engines of 207,061 tokens in 16-token blocks:
    2 × 2 × 8 × 12,942 = 414,144."""
    return SENT_HEADROOM * entries_to_remember(engine_tokens, block_tokens)


class _Generations:
    """One endpoint's entries: the current and the previous generation."""

    __slots__ = ("current", "previous")

    def __init__(self) -> None:
        self.current: dict[int, float] = {}
        self.previous: dict[int, float] = {}

    def get(self, block: int) -> float | None:
        stamp = self.current.get(block)
        return stamp if stamp is not None else self.previous.get(block)

    def __len__(self) -> int:
        return len(self.current) + len(self.previous)


class PrefixIndex:
    """A bounded, aging map of (block hash, endpoint) → last time recorded."""

    __slots__ = ("_max_entries", "_max_age_s", "_refresh_s", "_clock", "_maps", "_current")

    def __init__(self, max_entries: int, max_age_s: float,
                 clock: Callable[[], float] = time.monotonic, refresh_s: float = 0.0) -> None:
        if max_entries < 1 or max_age_s <= 0:
            raise ValueError("max_entries and max_age_s must be positive")
        self._max_entries = max_entries
        self._max_age_s = max_age_s
        self._refresh_s = refresh_s
        self._clock = clock
        self._maps: dict[str, _Generations] = {}
        self._current = 0  # entries in the current generations, all endpoints together

    def __len__(self) -> int:
        """Entries held, stale ones included (never above ``max_entries``)."""
        return sum(len(g) for g in self._maps.values())

    @property
    def max_entries(self) -> int:
        return self._max_entries

    def record(self, endpoint: str, hashes: Sequence[int]) -> None:
        """Remember that ``endpoint`` now holds the blocks ``hashes`` (a request's chain)."""
        half = self._max_entries // 2 or 1
        if len(hashes) > half:
            hashes = hashes[:half]  # a prefix of the chain: still a chain
        if self._current + len(hashes) > half:
            self._rotate()
        gens = self._maps.get(endpoint)
        if gens is None:
            gens = self._maps[endpoint] = _Generations()
        current, now = gens.current, self._clock()
        held = _fresh_prefix(hashes, current, now - self._refresh_s) if self._refresh_s else 0
        before = len(current)
        current.update(zip(hashes[held:], repeat(now)))
        self._current += len(current) - before

    def _rotate(self) -> None:
        """Drop every previous generation; the current ones become the previous ones."""
        for gens in self._maps.values():
            gens.previous, gens.current = gens.current, {}
        self._current = 0

    def match(self, hashes: Sequence[int],
              endpoints: Iterable[str] | None = None) -> dict[str, int]:
        """Per endpoint (all known, or those of ``endpoints``), how many leading blocks of
        ``hashes`` it probably holds; endpoints with none are left out.

        Per endpoint: block 0 first, then a binary search whose first probes test ``hint``,
        the length found on the previous endpoint (prompts are held up to the same
        boundaries, the end of a shared system prompt or of an earlier turn, so it is often
        exact). Both generations are looked up in line, and the search is written out here
        rather than called per endpoint: this is the innermost loop of every request."""
        if not hashes:
            return {}
        cutoff = self._clock() - self._max_age_s
        maps = self._maps
        out: dict[str, int] = {}
        hint, head, blocks = 0, hashes[0], len(hashes)
        for url in (maps if endpoints is None else endpoints):
            gens = maps.get(url)
            if gens is None:
                continue
            current, previous = gens.current.get, gens.previous.get
            stamp = current(head) or previous(head)
            if stamp is None or stamp < cutoff:
                continue
            lo, hi = 0, blocks
            if 1 < hint <= hi:
                stamp = current(hashes[hint - 1]) or previous(hashes[hint - 1])
                if stamp is not None and stamp >= cutoff:
                    lo = hint
                    if hint < hi:
                        stamp = current(hashes[hint]) or previous(hashes[hint])
                        if stamp is not None and stamp >= cutoff:
                            lo = hint + 1
                        else:
                            hi = hint
                else:
                    hi = hint - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                stamp = current(hashes[mid - 1]) or previous(hashes[mid - 1])
                if stamp is not None and stamp >= cutoff:
                    lo = mid
                else:
                    hi = mid - 1
            if lo:
                out[url] = hint = lo
        return out

    def holds(self, endpoint: str, block: int, since: float) -> bool:
        """Whether ``endpoint``'s current generation holds ``block``, recorded at ``since`` or
        later (a block only in the previous generation is due to be dropped: not held)."""
        gens = self._maps.get(endpoint)
        stamp = gens.current.get(block) if gens is not None else None
        return stamp is not None and stamp >= since

    def forget(self, endpoint: str, hashes: Iterable[int]) -> None:
        """Drop the entries of ``hashes`` on ``endpoint`` (absent ones are ignored)."""
        gens = self._maps.get(endpoint)
        if gens is None:
            return
        before = len(gens.current)
        for h in hashes:
            gens.current.pop(h, None)
            gens.previous.pop(h, None)
        self._current -= before - len(gens.current)

    def forget_endpoint(self, url: str) -> None:
        """Stop matching anything recorded for ``url`` (e.g. it restarted or was removed)."""
        gens = self._maps.pop(url, None)
        if gens is not None:
            self._current -= len(gens.current)

    def held_blocks(self) -> dict[str, int]:
        """Per endpoint, the distinct blocks it holds recorded within ``max_age_s`` (endpoints
        with none are left out). A block in both generations counts once."""
        fresh = (self._clock() - self._max_age_s).__le__
        out: dict[str, int] = {}
        for url, gens in self._maps.items():
            current, previous = gens.current, gens.previous
            held = sum(map(fresh, current.values()))
            if previous:
                older = previous.keys() - current.keys()
                held += sum(map(fresh, map(previous.__getitem__, older)))
            if held:
                out[url] = held
        return out

    def clear(self) -> None:
        self._maps.clear()
        self._current = 0


def _fresh_prefix(hashes: Sequence[int], entries: dict[int, float], since: float) -> int:
    """How many leading ``hashes`` ``entries`` hold, recorded at ``since`` or later."""
    get = entries.get
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        stamp = get(hashes[mid - 1])
        if stamp is not None and stamp >= since:
            lo = mid
        else:
            hi = mid - 1
    return lo
