"""Which endpoint recently served which prompt blocks: a bounded, aging prefix index.

Algorithm. One entry per (block hash, endpoint), held in an ``OrderedDict`` in least-recently
recorded order, valued by the time it was last recorded. The key packs both parts into one
integer, ``hash << 32 | endpoint id`` (endpoint URLs get small ids), which keeps an entry at
about 220 bytes (measured with tracemalloc on CPython 3.11).

- ``record(endpoint, hashes)`` writes the hashes LAST to FIRST, each moved to the most
  recent end, then evicts from the least recent end while there are more than
  ``max_entries`` entries, and drops a bounded number of entries older than ``max_age_s``
  (lazy, incremental purge: work proportional to the blocks recorded). O(blocks).
- Because the hashes are chained, block i on an endpoint implies blocks 0..i there; and
  because a request's blocks are written last to first, block j < i is always at least as
  recent as block i, so eviction and aging remove a chain from its tail. The set of a
  request's blocks an endpoint holds is therefore a prefix, and ``match(hashes)`` finds its
  length per endpoint by binary search: O(endpoints × log blocks) look-ups. Entries older
  than ``max_age_s`` count as absent even before they are purged.
- ``forget(endpoint, hashes)`` removes those blocks of one endpoint (a request that was
  recorded when its replica was chosen, then failed: pass the blocks past the match the
  endpoint already had, so the held set stays a prefix). O(blocks).
- ``forget_endpoint(url)`` retires the endpoint's id in O(1): its entries stop matching at
  once and leave through eviction and aging; if the URL comes back it gets a new id (an
  engine that restarted has an empty cache).

Parameters: ``max_entries`` caps the (hash, endpoint) entries (memory ≈ 220 bytes each);
``max_age_s`` is how long a recorded block counts as cached (seconds; engines evict under
memory pressure, so an old record is a guess gone stale); ``clock`` returns seconds
(monotonic).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

_ID_BITS = 32  # low bits of an entry key hold the endpoint id
_PURGE_MIN = 16  # aged entries dropped per record call, at least


class PrefixIndex:
    """A bounded, aging map of (block hash, endpoint) → last time recorded."""

    __slots__ = ("_max_entries", "_max_age_s", "_clock", "_entries", "_ids", "_next_id")

    def __init__(self, max_entries: int, max_age_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or max_age_s <= 0:
            raise ValueError("max_entries and max_age_s must be positive")
        self._max_entries = max_entries
        self._max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[int, float] = OrderedDict()
        self._ids: dict[str, int] = {}
        self._next_id = 1

    def __len__(self) -> int:
        """Entries held, stale ones not yet purged included (never above ``max_entries``)."""
        return len(self._entries)

    @property
    def max_entries(self) -> int:
        return self._max_entries

    def _id_for(self, endpoint: str) -> int:
        eid = self._ids.get(endpoint)
        if eid is None:
            eid = self._next_id
            self._next_id = (self._next_id + 1) % (1 << _ID_BITS) or 1
            self._ids[endpoint] = eid
        return eid

    def record(self, endpoint: str, hashes: Sequence[int]) -> None:
        """Remember that ``endpoint`` now holds the blocks ``hashes`` (a request's chain)."""
        now = self._clock()
        eid = self._id_for(endpoint)
        entries = self._entries
        for h in reversed(hashes):
            key = (h << _ID_BITS) | eid
            entries[key] = now
            entries.move_to_end(key)
        self._evict(now, len(hashes) + _PURGE_MIN)

    def _evict(self, now: float, budget: int) -> None:
        entries = self._entries
        while len(entries) > self._max_entries:
            entries.popitem(last=False)
        cutoff = now - self._max_age_s
        for _ in range(budget):
            if not entries or entries[next(iter(entries))] >= cutoff:
                return
            entries.popitem(last=False)

    def _leading(self, hashes: Sequence[int], eid: int, cutoff: float) -> int:
        """How many leading ``hashes`` are held fresh for endpoint id ``eid``."""
        entries = self._entries
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            stamp = entries.get((hashes[mid - 1] << _ID_BITS) | eid)
            if stamp is not None and stamp >= cutoff:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def match(self, hashes: Sequence[int],
              endpoints: Iterable[str] | None = None) -> dict[str, int]:
        """Per endpoint (all known, or those of ``endpoints``), how many leading blocks of
        ``hashes`` it probably holds; endpoints with none are left out."""
        if not hashes:
            return {}
        cutoff = self._clock() - self._max_age_s
        urls = self._ids if endpoints is None else endpoints
        out: dict[str, int] = {}
        for url in urls:
            eid = self._ids.get(url)
            if eid is not None and (n := self._leading(hashes, eid, cutoff)):
                out[url] = n
        return out

    def forget(self, endpoint: str, hashes: Sequence[int]) -> None:
        """Drop the entries of ``hashes`` on ``endpoint`` (absent ones are ignored)."""
        eid = self._ids.get(endpoint)
        if eid is None:
            return
        for h in hashes:
            self._entries.pop((h << _ID_BITS) | eid, None)

    def forget_endpoint(self, url: str) -> None:
        """Stop matching anything recorded for ``url`` (e.g. it restarted or was removed)."""
        self._ids.pop(url, None)

    def clear(self) -> None:
        self._entries.clear()
        self._ids.clear()
