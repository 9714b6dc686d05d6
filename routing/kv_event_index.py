"""The blocks each engine reports holding, from its KV-cache events: the precise prefix index.

Algorithm. Per followed endpoint, the engine's events (:mod:`routing.kv_events`) are re-hashed
into the router's own chained block hashes, the ones :mod:`routing.features` computes for a
request's exact prompt tokens (:func:`routing.features.token_block_hashes`: ``block_tokens`` ids
a block, chained from the model's name), so a request is matched against what the engine holds
with the same look-ups as the approximate index, and the engine's hash function never matters.

- ``BlocksStored``: the parent's router hash is the last router hash of the engine block named
  ``parent`` (the chain's start, :func:`routing.features.chain_start` of each model the endpoint
  serves, when ``parent`` is None); each engine block of ``block_size`` tokens becomes
  ``block_size ÷ block_tokens`` router blocks (the engine's block size must be a multiple of the
  router's: vLLM's 16 on GPUs and 128 on CPUs are, for the default 16). A block whose parent the
  index does not know (its store event was missed), or whose hash covers more than its tokens
  (``plain`` False: LoRA, images, a cache salt), is skipped: it cannot be matched by tokens.
- A ``BlocksStored`` without tokens (``block_size`` 0: vLLM's CPU offloading announces its
  copies of device blocks so, unless its connector is told to describe them) adds that medium
  to blocks the index knows and is otherwise skipped.
- ``BlocksRemoved``: the engine block leaves that medium; when no medium holds it any more, its
  router blocks go: a block in both the device cache and a host tier stays until both evicted
  it.
- Tiers: per endpoint, the router blocks held on the device are counted apart, so a match that
  reaches past them into a host tier is priced (:meth:`match_tiers`): reloading a block costs
  ``reload_ratio`` of recomputing it (:func:`routing.fleet_math.host_reload_ratio`, from the
  pool's facts), cheaper than recomputation and dearer than a device hit.
- ``AllCleared`` and :meth:`reset` (the engine restarted, or events were lost) empty the
  endpoint.
- ``match(hashes, endpoints)``: per followed endpoint, the number of leading request blocks it
  holds, in whole engine blocks (a router block shorter than the engine's may match the head of
  another prompt's block: the engine reuses only whole blocks), by binary search (an engine
  evicts a block's descendants before the block, as vLLM frees a request's blocks tail first,
  so the held blocks of a chain are a prefix; the engine's own look-up stops at the first miss
  too). O(endpoints × log blocks).
- Requests in flight: an engine stores a prompt's blocks only once its prefill ran, so a burst
  sharing a new prefix would see nothing held. :meth:`placed` records a placed request's blocks
  as pending on its endpoint for ``pending_s`` seconds (a small :class:`PrefixIndex`) and
  :meth:`finished` drops them (by then the engine's events say what it kept): ``match`` is the
  longer of the engine's blocks and the pending ones.

Memory: ``max_blocks`` caps the router blocks held over all endpoints (a store past it is
dropped and counted in ``dropped``); :data:`BYTES_PER_BLOCK` per router block, plus one entry
per engine block. Sized from the fleet's KV capacity, the cap is never reached by engines that
report truthfully.

Parameters: ``block_tokens`` (tokens per router block), ``max_blocks`` (router blocks, all
endpoints), ``pending_s`` (seconds a placed request's blocks count as held before its engine
reports them), ``clock`` (monotonic seconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence

from routing.features import chain_start, chain_token_hashes
from routing.kv_events import MEDIUM_DEVICE, AllCleared, BlocksRemoved, BlocksStored, KvEvent
from routing.prefix_index import PrefixIndex

BYTES_PER_BLOCK = 200
"""[B] Memory per router block, rounded up: its entry in the endpoint's held map (a dict slot,
an int key and count, ~80 B) plus its share of the engine-block entry (a tuple of router
hashes and a media set, ~100 B per 8 router blocks, more for small engine blocks)."""


class _Engine:
    """One endpoint's held blocks: router hash → holders; engine hash → (router hashes, media)."""

    __slots__ = ("seeds", "reload_ratio", "held", "device", "tiered", "blocks", "per_block")

    def __init__(self, seeds: tuple[int, ...], reload_ratio: float) -> None:
        self.seeds = seeds
        self.reload_ratio = reload_ratio
        self.per_block = 1  # router blocks per engine block (engine block size ÷ block_tokens)
        self.held: dict[int, int] = {}  # router hash → engine blocks holding it, any medium
        self.device: dict[int, int] = {}  # router hash → those on the device
        self.tiered = 0  # engine blocks held in a host tier (a medium other than the device)
        self.blocks: dict[Hashable, tuple[tuple[int, ...], set[str]]] = {}

    def add_medium(self, routers: tuple[int, ...], media: set[str], medium: str) -> None:
        if medium in media:
            return
        if medium == MEDIUM_DEVICE:
            _count(self.device, routers, 1)
        elif media <= {MEDIUM_DEVICE}:
            self.tiered += 1
        media.add(medium)

    def drop_medium(self, routers: tuple[int, ...], media: set[str], medium: str) -> None:
        if medium not in media:
            return
        media.discard(medium)
        if medium == MEDIUM_DEVICE:
            _count(self.device, routers, -1)
        elif media <= {MEDIUM_DEVICE}:
            self.tiered -= 1


class KvEventIndex:
    """The engines' own KV blocks, re-hashed for matching (module docstring)."""

    __slots__ = ("_block_tokens", "_max_blocks", "_engines", "_size", "_pending", "dropped")

    def __init__(self, block_tokens: int, max_blocks: int, pending_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if block_tokens < 1 or max_blocks < 1 or pending_s <= 0:
            raise ValueError("block_tokens, max_blocks and pending_s must be positive")
        self._block_tokens = block_tokens
        self._max_blocks = max_blocks
        self._engines: dict[str, _Engine] = {}
        self._size = 0
        self._pending = PrefixIndex(max(2, max_blocks // 8), pending_s, clock)
        self.dropped = 0
        """Stored router blocks dropped at the ``max_blocks`` cap (or for an engine block size
        that is not a multiple of ``block_tokens``)."""

    def __len__(self) -> int:
        """Router blocks held, all endpoints."""
        return self._size

    @property
    def max_blocks(self) -> int:
        return self._max_blocks

    def follow(self, endpoint: str, models: Sequence[str], reload_ratio: float = 0.0) -> None:
        """Take ``endpoint``'s events from now on; it serves ``models`` (each a chain seed);
        ``reload_ratio``: what reloading a block from its host tier costs against recomputing
        it (:func:`routing.fleet_math.host_reload_ratio`; 0 = as if on the device). An endpoint
        followed already keeps its blocks, unless its models changed."""
        seeds = tuple(chain_start(m) for m in models)
        engine = self._engines.get(endpoint)
        if engine is not None and engine.seeds != seeds:
            self.drop(endpoint)
            engine = None
        if engine is None:
            engine = self._engines[endpoint] = _Engine(seeds, reload_ratio)
        engine.reload_ratio = reload_ratio

    def drop(self, endpoint: str) -> None:
        """Stop following ``endpoint``; its requests fall back to the approximate index."""
        engine = self._engines.pop(endpoint, None)
        if engine is not None:
            self._size -= len(engine.held)
        self._pending.forget_endpoint(endpoint)

    def follows(self, endpoint: str) -> bool:
        return endpoint in self._engines

    def reset(self, endpoint: str) -> None:
        """``endpoint`` holds nothing we know of (restarted, or its events were lost)."""
        engine = self._engines.get(endpoint)
        if engine is not None:
            self._size -= len(engine.held)
            engine.held.clear()
            engine.device.clear()
            engine.blocks.clear()
            engine.tiered = 0

    def apply(self, endpoint: str, events: Iterable[KvEvent]) -> None:
        """Apply ``endpoint``'s events in order (ignored for an endpoint not followed)."""
        engine = self._engines.get(endpoint)
        if engine is None:
            return
        for event in events:
            if isinstance(event, BlocksStored):
                self._stored(engine, event)
            elif isinstance(event, BlocksRemoved):
                self._removed(engine, event)
            elif isinstance(event, AllCleared):
                self.reset(endpoint)

    def _stored(self, engine: _Engine, event: BlocksStored) -> None:
        size, tokens = event.block_size, event.token_ids
        medium = event.medium or MEDIUM_DEVICE
        if size == 0:  # a tier's copy without its tokens (vLLM's CPU offloading): known ones
            for block in event.block_hashes:
                known = engine.blocks.get(block)
                if known is not None:
                    engine.add_medium(*known, medium)
            return
        if not event.plain or size % self._block_tokens:
            self.dropped += len(event.block_hashes) * max(1, size // self._block_tokens)
            return
        engine.per_block = size // self._block_tokens
        tails = self._parents(engine, event.parent)
        for i, block in enumerate(event.block_hashes):
            known = engine.blocks.get(block)
            if known is not None:
                engine.add_medium(*known, medium)
                tails = _tails(known[0], len(engine.seeds))
                continue
            ids = tokens[i * size:(i + 1) * size]
            if tails is None or len(ids) < size:
                return
            step = self._block_tokens
            routers = tuple(h for t in tails for h in chain_token_hashes(ids, step, t))
            if self._size + len(routers) > self._max_blocks:
                self.dropped += len(routers)
                return
            engine.blocks[block] = (routers, set())
            engine.add_medium(routers, engine.blocks[block][1], medium)
            self._size += _count(engine.held, routers, 1)
            tails = _tails(routers, len(tails))

    def _parents(self, engine: _Engine, parent: Hashable | None) -> tuple[int, ...] | None:
        """The router chain tails after ``parent``, one per seed (None: parent unknown)."""
        if parent is None:
            return engine.seeds
        known = engine.blocks.get(parent)
        return None if known is None else _tails(known[0], len(engine.seeds))

    def _removed(self, engine: _Engine, event: BlocksRemoved) -> None:
        medium = event.medium or MEDIUM_DEVICE
        for block in event.block_hashes:
            known = engine.blocks.get(block)
            if known is None:
                continue
            engine.drop_medium(*known, medium)
            if not known[1]:
                del engine.blocks[block]
                self._size += _count(engine.held, known[0], -1)

    def match(self, hashes: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        """Per followed endpoint of ``endpoints``, the leading blocks of ``hashes`` it holds or
        has pending; endpoints with none (and endpoints not followed) are left out."""
        return self.match_tiers(hashes, endpoints)[0]

    def match_tiers(self, hashes: Sequence[int], endpoints: Iterable[str]
                    ) -> tuple[dict[str, int], dict[str, float]]:
        """:meth:`match`, and per endpoint whose match reaches into its host tier, what
        reloading those blocks costs in tokens recomputed: host-only blocks × block_tokens ×
        its ``reload_ratio`` (endpoints with no such cost left out)."""
        matched: dict[str, int] = {}
        reload: dict[str, float] = {}
        if not hashes:
            return matched, reload
        engines = self._engines
        pending = self._pending.match(hashes, endpoints)
        for url in endpoints:
            engine = engines.get(url)
            if engine is None:
                continue
            held = _leading(hashes, engine.held)
            held -= held % engine.per_block
            n = max(held, pending.get(url, 0))
            if n:
                matched[url] = n
            if held and engine.tiered and engine.reload_ratio:
                device = _leading(hashes, engine.device)
                host = held - (device - device % engine.per_block)
                if host > 0:
                    reload[url] = host * self._block_tokens * engine.reload_ratio
        return matched, reload

    def placed(self, endpoint: str, hashes: Sequence[int]) -> None:
        """A request with blocks ``hashes`` was sent to ``endpoint`` (if followed)."""
        if hashes and endpoint in self._engines:
            self._pending.record(endpoint, hashes)

    def finished(self, endpoint: str, hashes: Sequence[int]) -> None:
        """That request finished: its engine's events now tell what it kept."""
        if hashes and endpoint in self._engines:
            self._pending.forget(endpoint, hashes)

    def held_blocks(self) -> dict[str, int]:
        """Per followed endpoint, the router blocks it holds (endpoints with none left out)."""
        return {url: len(e.held) for url, e in self._engines.items() if e.held}


def _count(counts: dict[int, int], routers: Sequence[int], step: int) -> int:
    """Add ``step`` (±1) to each of ``routers``' counts, dropping those that reach 0; the
    change in the number of distinct keys."""
    before = len(counts)
    for h in routers:
        n = counts.get(h, 0) + step
        if n > 0:
            counts[h] = n
        else:
            counts.pop(h, None)
    return len(counts) - before


def _tails(routers: tuple[int, ...], seeds: int) -> tuple[int, ...]:
    """The last router hash of each seed's chain in an engine block's ``routers`` (the seeds'
    chains one after the other, equally long)."""
    step = len(routers) // seeds
    return routers[step - 1::step]


def _leading(hashes: Sequence[int], held: dict[int, int]) -> int:
    """How many leading ``hashes`` ``held`` has (binary search: held chains are prefixes)."""
    if hashes[0] not in held:
        return 0
    lo, hi = 1, len(hashes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1] in held:
            lo = mid
        else:
            hi = mid - 1
    return lo
