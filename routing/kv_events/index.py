"""The blocks each engine reports holding, from its KV-cache events: the precise prefix index.

:class:`KvEventIndex` re-hashes each followed endpoint's events (:mod:`routing.kv_events.events`)
into the router's own chained block hashes (:func:`routing.features.token_block_hashes`), so a
request is matched with the same look-ups as the approximate index and the engine's hash
function never matters. An engine block of a multiple of ``block_tokens`` tokens makes several
router blocks; smaller ones (SGLang's pages) are accumulated along their chain; a block that
cannot be matched by tokens is skipped and counted in ``dropped``.

Invariants: a router block is held while the block completing it and each of its members is
held in some medium (one partly evicted is not); a chain's held blocks are a prefix, so
``match`` is a binary search, in whole engine blocks, taking the longer of that and the blocks
of requests placed but not yet reported (pending ``pending_s`` seconds). Host-tier blocks are
priced at the endpoint's ``reload_ratio``. Router blocks are capped at ``max_blocks``, all
endpoints; memory at :data:`BYTES_PER_BLOCK` and :data:`BYTES_PER_PAGE`.

See docs/routing.md#kv-events-and-the-precise-index.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence

from routing.features import chain_start, chain_token_hashes
from routing.kv_events.events import MEDIUM_DEVICE, AllCleared, BlocksRemoved, BlocksStored, KvEvent
from routing.prefix_index import EXACT, PrefixIndex

BYTES_PER_BLOCK = 400
"""[B] Memory per router block held, rounded up: its entry in the endpoint's held map (a dict
slot, an int key and count) plus the engine block completing it (its block-map entry, its
object and its hash; an engine block of several router blocks is shared by them). What was
measured: docs/routing.md#kv-events-and-the-precise-index."""
BYTES_PER_PAGE = 300
"""[B] Memory per engine block smaller than a router block that completes none (an SGLang page,
one token by default): its block-map entry, its object, hash and token ids."""

HELD, DEVICE, TIER = 1, 2, 4
"""How an engine block's router blocks are counted: held (in any medium), on the device, with a
part in a host tier."""


class _Block:
    """One engine block (or page) an endpoint reported: ``key`` its hash; ``routers`` the router
    blocks it completes (the seeds' chains one after the other); ``members`` the earlier blocks
    holding the head of its first router block (blocks smaller than a router block);
    ``dependents`` the blocks whose ``members`` include it; ``tails`` the router chain tails
    (one per seed) at the last router block boundary at or before its end; ``phase`` its chain's
    tokens past that boundary, held by ``tokens`` (its own ids, kept only when some are past
    it) and, further back, ``parent`` (kept only when the tokens past the boundary reach into
    it); ``media`` where the engine holds it; ``counted`` how its routers are counted now
    (:data:`HELD` | :data:`DEVICE` | :data:`TIER`); ``refs`` the known blocks naming it as
    member or parent."""

    __slots__ = ("key", "routers", "members", "dependents", "tails", "phase", "tokens",
                 "parent", "media", "counted", "refs")

    def __init__(self, key: Hashable, routers: tuple[int, ...], members: tuple[_Block, ...],
                 tails: tuple[int, ...], phase: int, tokens: tuple[int, ...],
                 parent: _Block | None) -> None:
        self.key, self.routers, self.members = key, routers, members
        self.tails, self.phase, self.tokens, self.parent = tails, phase, tokens, parent
        self.dependents: tuple[_Block, ...] = ()
        self.media: frozenset[str] = frozenset()
        self.counted = 0
        self.refs = 0

    def referenced(self) -> tuple[_Block, ...]:
        """The blocks this one names: its members, else the parent it keeps (members, when
        there are any, end with the parent)."""
        if self.members:
            return self.members
        return () if self.parent is None else (self.parent,)


class _Engine:
    """One endpoint's held blocks: router hash → holders; engine hash → its :class:`_Block`."""

    __slots__ = ("seeds", "reload_ratio", "held", "device", "tiered", "blocks", "per_block",
                 "pages", "media_sets")

    def __init__(self, seeds: tuple[int, ...], reload_ratio: float) -> None:
        self.seeds = seeds
        self.reload_ratio = reload_ratio
        self.per_block = 1  # router blocks per engine block (engine block size ÷ block_tokens)
        self.held: dict[int, int] = {}  # router hash → engine blocks holding it, any medium
        self.device: dict[int, int] = {}  # router hash → those on the device
        self.tiered = 0  # engine blocks whose router blocks have a part in a host tier
        self.blocks: dict[Hashable, _Block] = {}
        self.pages = 0  # blocks completing no router block
        self.media_sets: dict[frozenset[str], frozenset[str]] = {}  # one object per media set

    def media(self, media: frozenset[str]) -> frozenset[str]:
        """The one shared object equal to ``media``."""
        return self.media_sets.setdefault(media, media)


class KvEventIndex:
    """The engines' own KV blocks, re-hashed for matching
    (docs/routing.md#kv-events-and-the-precise-index)."""

    __slots__ = ("_block_tokens", "_max_blocks", "_engines", "_size", "_pages", "_pending",
                 "dropped")

    def __init__(self, block_tokens: int, max_blocks: int, pending_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if block_tokens < 1 or max_blocks < 1 or pending_s <= 0:
            raise ValueError("block_tokens, max_blocks and pending_s must be positive")
        self._block_tokens = block_tokens
        self._max_blocks = max_blocks
        self._engines: dict[str, _Engine] = {}
        self._size = 0
        self._pages = 0
        self._pending = PrefixIndex(max(2, max_blocks // 8), pending_s, clock, layout=EXACT)
        self.dropped = 0
        """Stored blocks dropped at the ``max_blocks`` cap, or not matchable by tokens (a
        size neither below nor a multiple of ``block_tokens``, a hash covering more than the
        tokens)."""

    def __len__(self) -> int:
        """Router blocks held, all endpoints."""
        return self._size

    @property
    def max_blocks(self) -> int:
        return self._max_blocks

    @property
    def pages(self) -> int:
        """Known engine blocks that complete no router block (SGLang's pages), all endpoints."""
        return self._pages

    def memory_bytes(self) -> int:
        """Estimated memory [B]: router blocks × :data:`BYTES_PER_BLOCK` + pages ×
        :data:`BYTES_PER_PAGE`."""
        return self._size * BYTES_PER_BLOCK + self._pages * BYTES_PER_PAGE

    def follow(self, endpoint: str, models: Sequence[str], reload_ratio: float = 0.0) -> None:
        """Take ``endpoint``'s events from now on; it serves ``models`` (each a chain seed);
        ``reload_ratio``: what reloading a block from its host tier costs against recomputing
        it (:func:`routing.formulas.host_reload_ratio`; 0 = as if on the device). An endpoint
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
            self._pages -= engine.pages
        self._pending.forget_endpoint(endpoint)

    def follows(self, endpoint: str) -> bool:
        return endpoint in self._engines

    def reset(self, endpoint: str) -> None:
        """``endpoint`` holds nothing we know of (restarted, or its events were lost)."""
        engine = self._engines.get(endpoint)
        if engine is not None:
            self._size -= len(engine.held)
            self._pages -= engine.pages
            engine.held.clear()
            engine.device.clear()
            engine.blocks.clear()
            engine.tiered = engine.pages = 0

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
        size, tokens, step = event.block_size, event.token_ids, self._block_tokens
        medium = event.medium or MEDIUM_DEVICE
        if size == 0:  # a tier's copy without its tokens (vLLM's CPU offloading): known ones
            for key in event.block_hashes:
                known = engine.blocks.get(key)
                if known is not None:
                    self._set_media(engine, known, known.media | {medium})
            return
        if not event.plain or (size > step and size % step):
            self.dropped += len(event.block_hashes) * max(1, size // step)
            return
        engine.per_block = max(1, size // step)
        prev = None if event.parent is None else engine.blocks.get(event.parent)
        placed = event.parent is None or prev is not None
        for i, key in enumerate(event.block_hashes):
            block = engine.blocks.get(key)
            if block is None:
                ids = tokens[i * size:(i + 1) * size]
                if not placed or len(ids) < size:
                    return
                block = self._new_block(engine, key, prev, ids)
                if block is None:
                    return
            self._set_media(engine, block, block.media | {medium})
            prev, placed = block, True

    def _new_block(self, engine: _Engine, key: Hashable, parent: _Block | None,
                   ids: Sequence[int]) -> _Block | None:
        """The block ``key`` holding ``ids`` after ``parent`` (None: the chain's start), known
        from now on, held nowhere yet; None past the cap."""
        step = self._block_tokens
        carried, members = _carry(parent)
        run = carried + list(ids)
        whole = len(run) - len(run) % step
        tails = engine.seeds if parent is None else parent.tails
        routers = tuple(h for t in tails for h in chain_token_hashes(run[:whole], step, t))
        if self._size + len(routers) > self._max_blocks or (
                not routers and self._pages >= self._max_blocks * step):
            self.dropped += max(1, len(routers))
            return None
        phase = len(run) - whole
        block = _Block(key, routers, members if routers else (),
                       _tails(routers, len(tails)) if routers else tails, phase,
                       tuple(ids) if phase else (), parent if phase > len(ids) else None)
        for named in block.referenced():
            named.refs += 1
        for member in block.members:
            member.dependents += (block,)
        engine.blocks[key] = block
        if not routers:
            engine.pages += 1
            self._pages += 1
        return block

    def _set_media(self, engine: _Engine, block: _Block, media: frozenset[str]) -> None:
        """``block`` is now held in ``media``: recount it and the blocks depending on it."""
        if media == block.media:
            return
        block.media = engine.media(media)
        for changed in (block, *block.dependents):
            self._recount(engine, changed)

    def _recount(self, engine: _Engine, block: _Block) -> None:
        """Count ``block``'s router blocks as its media and its members' now say."""
        now = _counted(block) if block.routers else 0
        changed, block.counted = now ^ block.counted, now
        if changed & HELD:
            self._size += _count(engine.held, block.routers, 1 if now & HELD else -1)
        if changed & DEVICE:
            _count(engine.device, block.routers, 1 if now & DEVICE else -1)
        if changed & TIER:
            engine.tiered += 1 if now & TIER else -1

    def _removed(self, engine: _Engine, event: BlocksRemoved) -> None:
        medium = event.medium or MEDIUM_DEVICE
        for key in event.block_hashes:
            block = engine.blocks.get(key)
            if block is None or medium not in block.media:
                continue
            self._set_media(engine, block, block.media - {medium})
            if not block.media:
                self._forget(engine, block)

    def _forget(self, engine: _Engine, block: _Block) -> None:
        """Forget ``block`` if no medium holds it and no known block names it, and in turn the
        blocks it named (a block held nowhere stays known while one naming it is: stored
        again, it counts for those at once)."""
        work = [block]
        while work:
            gone = work.pop()
            if gone.media or gone.refs or engine.blocks.get(gone.key) is not gone:
                continue
            del engine.blocks[gone.key]
            if not gone.routers:
                engine.pages -= 1
                self._pages -= 1
            for named in gone.referenced():
                named.refs -= 1
                named.dependents = tuple(d for d in named.dependents if d is not gone)
                work.append(named)

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


def _carry(block: _Block | None) -> tuple[list[int], tuple[_Block, ...]]:
    """The token ids of ``block``'s chain past its last router block boundary, and the blocks
    holding them, oldest first (none at the chain's start)."""
    chunks: list[tuple[int, ...]] = []
    held: list[_Block] = []
    need = 0 if block is None else block.phase
    while need > 0 and block is not None:
        take = min(need, len(block.tokens))
        chunks.append(block.tokens[len(block.tokens) - take:])
        held.append(block)
        need -= take
        block = block.parent
    return [i for chunk in reversed(chunks) for i in chunk], tuple(reversed(held))


def _counted(block: _Block) -> int:
    """How ``block``'s router blocks count: :data:`HELD` when it and each member are held
    somewhere, :data:`DEVICE` when all on the device, :data:`TIER` when a part is in a host
    tier (0 when one is held nowhere: a router block partly evicted is not held)."""
    blocks = (block, *block.members)
    if not all(b.media for b in blocks):
        return 0
    device = all(MEDIUM_DEVICE in b.media for b in blocks)
    tier = any(len(b.media) > (MEDIUM_DEVICE in b.media) for b in blocks)
    return HELD | (DEVICE if device else 0) | (TIER if tier else 0)


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
