"""The simulator's KV-cache events: what its prefix cache stores and evicts, reported as its
engine reports its own: vLLM 0.32 (``vllm/v1/core/block_pool.py``,
``vllm/v1/core/sched/scheduler.py``) or SGLang 0.5.23 (``sglang/srt/mem_cache/events.py``),
chosen by the pool's engine from :data:`SIM_FORMATS`.

What vLLM sends, and the simulator with it (the cache's changes, :mod:`backends.sim.kvcache`):

- **BlockStored**, medium ``GPU``: ``cache_full_blocks`` caches the blocks a step fills for one
  request and reports them as one event: their hashes, ``parent`` (the hash of the block before
  the first; None at the prompt's start), their token ids, ``block_size``. Here: each run of
  blocks named in a row for one request, at consecutive places in its chain, is one event
  (blocks reloaded from the host tier are named too, as vLLM caches the blocks its connector
  loads). A block already cached under its name is not announced again: vLLM re-announces
  prefix hits (``emit_cached_block_events``) only for requests sent with
  ``kv_cache_report_mode: full``, not by default.
- **BlockRemoved**, medium ``GPU``: one event per evicted hash (``_maybe_evict_cached_block``),
  when its block is reused for another.
- **AllBlocksCleared** (``reset_prefix_cache``): the simulator has no reset, so never.
- **Host tier** (vLLM's ``OffloadingConnector``, what ``--kv-offloading-backend native``
  installs): with KV events on, its events follow the device's in the batch, medium ``CPU``.
  Unless the connector's extra config sets ``self_describing_kv_events`` (ridge's launch does
  not), a stored block is a placeholder, ``BlockStored([hash], None, [], block_size 0, CPU)``
  (``kv_connector/v1/offloading/events.py``), its hash the device block's (one block per
  offloaded chunk by default); an eviction is ``BlockRemoved(hashes, CPU)``. The simulator's
  write-through host tier sends the same for each block it gains or drops.
- **Batches**: the events of one step, in order, as one batch after the step (vLLM publishes
  ``take_events()`` from ``update_from_output`` when there are any), stamped with the wall
  clock [s since the epoch]; none for a step that changed nothing.

Block hashes: 32 bytes, as vLLM's default (sha256) sends them: here SHA-256 of the simulator's
own chained hash (8 bytes, big-endian, signed), the same for a block on the device and in the
host tier, stable for the process's life (the simulator's hashes are).

What SGLang sends, and the simulator with it (an SGLang pool's cache has one-token blocks, SGLang's
default page size, so each "block" below is a page):

- **BlockStored**, medium ``GPU``: the radix cache announces each node it inserts, one hash
  per page, chained from the page before (``parent_block_hash``), ``block_size`` the page size;
  its recorder joins an event continuing the previous one's chain (same medium, page size) to
  it, so a run of pages is one event. Here: the same runs as vLLM's, joined so.
- **BlockRemoved**, medium ``GPU``: one event per evicted node listing its pages' hashes,
  consecutive removals of one medium joined into one. Here: the evicted pages, joined so.
- **Host tier** (the hierarchical cache, write-through by default): a page backed up in host
  memory is announced as a full ``BlockStored`` (its tokens, its parent) with medium
  ``CPU_PINNED``, its eviction from there as ``BlockRemoved(..., CPU_PINNED)``. The simulator
  remembers each page's parent and tokens while a tier holds it, to describe its host copy so.
- **AllBlocksCleared**: sent when the radix cache starts or is flushed; the simulator has
  neither, so never.
- **Batches**: the events of one scheduler step, as one batch ``[ts, events, attn_dp_rank]``
  (rank 0).

Page hashes: signed 64-bit ints, as SGLang's ``hash_str_to_int64`` makes them from a page's
chained SHA-256 (its first 8 bytes): here the first 8 bytes of the vLLM-style 32-byte hash.

Token ids: those the engine computes. A prompt's are the model tokenizer's (the simulator keeps
them beside the tokens' text, :attr:`SimRequest.prompt_ids`), the ids the gateway computes for
the same request. A generated token (the simulator's words, :data:`backends.sim.tokens.VOCAB`,
or text repeated from the prompt) gets the id its text has alone: its one id when the text is
one token of the model (then the next turn, sending the answer back, tokenizes to it), else
the first of its ids (0 for none). A request whose prompt the tokenizer did not model (its
tokens are the 4-character estimate) has no ids: its blocks are not announced (their
evictions are: a consumer ignores a hash it does not know). Without the model's tokenizer
there are no ids at all: the fleet refuses ``kv_events`` for such a pool
(:mod:`backends.sim.fleet`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol, cast

from backends.kv_events.wire import WIRE_FORMATS
from backends.sim.kvcache import BlockPool, CacheChange, Dropped, HostDropped, HostStored, Named
from backends.sim.request import SimRequest
from config.fleet_file import Engine
from routing.kv_events.events import MEDIUM_DEVICE, BlocksRemoved, BlocksStored, KvEvent
from routing.tokens.exact import PromptTokenizer

MEDIUM_HOST = "CPU"
"""The medium vLLM's offloading connector names its host-memory tier (``MEDIUM_CPU``)."""
MEDIUM_HOST_SGLANG = "CPU_PINNED"
"""The medium SGLang names its hierarchical cache's host tier (``StorageMedium.CPU``)."""
MAX_TEXTS = 65_536
"""Generated-token texts whose id :class:`TokenIds` remembers."""


def block_key(block_hash: int) -> bytes:
    """The 32-byte hash a block is published under (module docstring)."""
    return hashlib.sha256(block_hash.to_bytes(8, "big", signed=True)).digest()


def page_key(block_hash: int) -> int:
    """The signed 64-bit hash an SGLang page is published under (module docstring)."""
    return int.from_bytes(block_key(block_hash)[:8], "big", signed=True)


@dataclass(frozen=True, slots=True)
class SimFormat:
    """What one engine kind's events look like (module docstring): ``key`` a block's published
    hash; ``host_medium`` its host tier's medium; ``host_tokens``: a host copy is announced with
    its tokens and parent (else as vLLM's placeholder, no tokens, block size 0); ``joined``:
    an event continuing the previous one (a store its chain, a removal its medium) joins it."""

    key: Callable[[int], Hashable]
    host_medium: str
    host_tokens: bool
    joined: bool


SIM_FORMATS: Mapping[Engine, SimFormat] = MappingProxyType({
    Engine.VLLM: SimFormat(block_key, MEDIUM_HOST, host_tokens=False, joined=False),
    Engine.SGLANG: SimFormat(page_key, MEDIUM_HOST_SGLANG, host_tokens=True, joined=True),
})  # fmt: skip
"""Engine → its events' look; the payload codec is the engine's
:data:`backends.kv_events.wire.WIRE_FORMATS` entry."""

Described = dict[int, tuple[int | None, tuple[int, ...]]]
"""Block hash → (its parent's hash, None at the chain's start; its token ids): what a format
whose host copies carry tokens remembers of the blocks a tier holds."""


def alone_id(tokenizer: PromptTokenizer, text: str) -> int:
    """The id ``text`` has alone: its only id when it is one token, else its first (0 for
    none). The ids are a completions prompt's with the tokenizer's own additions (those of an
    empty prompt, a BOS say) cut from both ends."""
    try:
        wrapped = list(tokenizer.completion_ids(text) or ())
        empty = list(tokenizer.completion_ids("") or ())
    except Exception:  # noqa: BLE001 - the library raises its own exception types
        return 0
    head = 0
    while head < min(len(empty), len(wrapped)) and wrapped[head] == empty[head]:
        head += 1
    tail = 0
    while (tail < len(empty) - head and tail < len(wrapped) - head
           and wrapped[-1 - tail] == empty[-1 - tail]):
        tail += 1
    core = wrapped[head:len(wrapped) - tail]
    return core[0] if core else 0


class TokenIds:
    """The model's token ids of a simulated request's tokens (module docstring)."""

    __slots__ = ("_tokenizer", "_texts")

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[str, int] = {}

    def span(self, req: SimRequest, start: int, end: int) -> list[int] | None:
        """The ids of ``req``'s tokens [start, end), or None when its prompt has none."""
        prompt = req.prompt_ids
        if prompt is None:
            return None
        n = len(prompt)
        ids = list(prompt[start:min(end, n)])
        if end > n:
            ids.extend(self.of_text(t) for t in req.tokens[max(start, n):end])
        return ids

    def of_text(self, text: str) -> int:
        """A generated token's id: :func:`alone_id` of its text, remembered."""
        known = self._texts.get(text)
        if known is None:
            known = alone_id(self._tokenizer, text)
            if len(self._texts) < MAX_TEXTS:
                self._texts[text] = known
        return known


def events_of(changes: Sequence[CacheChange], block_size: int, ids: TokenIds,
              fmt: SimFormat = SIM_FORMATS[Engine.VLLM],
              described: Described | None = None) -> list[KvEvent]:
    """One step's events from its cache changes: the device's in order, then the host
    tier's (module docstring), joined when the format says so. ``described``: where a format
    whose host copies carry tokens remembers the blocks named (updated here)."""
    device: list[KvEvent] = []
    run: list[Named] = []
    for change in changes:
        if isinstance(change, HostStored | HostDropped):
            continue
        if isinstance(change, Named) and (not run or _continues(run[-1], change)):
            run.append(change)
            continue
        if run:
            _add_stored(device, run, block_size, ids, fmt, described)
        run = [change] if isinstance(change, Named) else []
        if isinstance(change, Dropped):
            device.append(BlocksRemoved([fmt.key(change.block_hash)], MEDIUM_DEVICE))
    if run:
        _add_stored(device, run, block_size, ids, fmt, described)
    host = [e for c in changes if (e := _host_event(c, block_size, fmt, described)) is not None]
    return _joined(device + host) if fmt.joined else device + host


def _continues(last: Named, change: Named) -> bool:
    return change.owner is last.owner and change.index == last.index + 1


def _add_stored(out: list[KvEvent], run: list[Named], block_size: int, ids: TokenIds,
                fmt: SimFormat, described: Described | None) -> None:
    """The BlocksStored for ``run`` (blocks of one request, in chain order), if its tokens
    have ids; each block remembered in ``described`` (when given)."""
    owner, first = run[0].owner, run[0].index
    if not isinstance(owner, SimRequest):
        return
    token_ids = ids.span(owner, first * block_size, (run[-1].index + 1) * block_size)
    if token_ids is None:
        return
    parent = owner.hashes[first - 1] if first else None
    if described is not None:
        for i, named in enumerate(run):
            before = owner.hashes[named.index - 1] if named.index else None
            described[named.block_hash] = (
                before, tuple(token_ids[i * block_size:(i + 1) * block_size]))
    out.append(BlocksStored([fmt.key(c.block_hash) for c in run],
                            None if parent is None else fmt.key(parent), token_ids,
                            block_size, MEDIUM_DEVICE))


def _host_event(change: CacheChange, block_size: int, fmt: SimFormat,
                described: Described | None) -> KvEvent | None:
    """The host tier's event for ``change`` (None for a device change, or a host copy to
    describe whose tokens are unknown)."""
    if isinstance(change, HostDropped):
        return BlocksRemoved([fmt.key(change.block_hash)], fmt.host_medium)
    if not isinstance(change, HostStored):
        return None
    key = fmt.key(change.block_hash)
    if not fmt.host_tokens:
        return BlocksStored([key], None, [], 0, fmt.host_medium)
    known = None if described is None else described.get(change.block_hash)
    if known is None:
        return None
    parent, token_ids = known
    return BlocksStored([key], None if parent is None else fmt.key(parent), list(token_ids),
                        block_size, fmt.host_medium)


def _joined(events: list[KvEvent]) -> list[KvEvent]:
    """SGLang's recorder: a store continuing the previous store's chain (same medium and block
    size) joins it, a removal of the previous removal's medium joins it. The events' lists
    are this module's own, extended in place."""
    out: list[KvEvent] = []
    for event in events:
        last = out[-1] if out else None
        if (isinstance(event, BlocksStored) and isinstance(last, BlocksStored)
                and (last.medium, last.block_size) == (event.medium, event.block_size)
                and last.block_hashes and event.parent == last.block_hashes[-1]):
            cast(list[Hashable], last.block_hashes).extend(event.block_hashes)
            cast(list[int], last.token_ids).extend(event.token_ids)
        elif (isinstance(event, BlocksRemoved) and isinstance(last, BlocksRemoved)
              and last.medium == event.medium):
            cast(list[Hashable], last.block_hashes).extend(event.block_hashes)
        else:
            out.append(event)
    return out


class Publisher(Protocol):
    """Where batches go (:class:`backends.sim.kv_publisher.ZmqPublisher`)."""

    def publish(self, payload: bytes) -> None: ...

    def close(self) -> None: ...


class SimKvEvents:
    """One simulated engine's KV-cache events: :meth:`flush` after each step publishes the
    step's changes as one batch (module docstring), in ``engine``'s format. ``wall_clock``: the
    batches' time stamps [s since the epoch]."""

    def __init__(self, pool: BlockPool, ids: TokenIds, publisher: Publisher,
                 wall_clock: Callable[[], float] = time.time, *,
                 engine: Engine = Engine.VLLM) -> None:
        self.pool = pool
        self.publisher = publisher
        self.format = SIM_FORMATS[engine]
        self._ids = ids
        self._codec = WIRE_FORMATS[engine.value].codec()
        self._wall_clock = wall_clock
        self._described: Described | None = (
            {} if self.format.host_tokens and pool.host is not None else None)
        pool.record_changes()

    def flush(self) -> None:
        """Publish the changes since the last call as one batch (nothing when there are none)."""
        changes = self.pool.take_changes()
        if not changes:
            return
        events = events_of(changes, self.pool.block_size, self._ids, self.format,
                           self._described)
        self._forget_unheld(changes)
        if events:
            self.publisher.publish(self._codec.encode(self._wall_clock(), events))

    def _forget_unheld(self, changes: Sequence[CacheChange]) -> None:
        """Forget the described blocks of ``changes`` that neither tier holds any more."""
        described, host = self._described, self.pool.host
        if described is None or host is None:
            return
        cached = self.pool.cached_names()
        for change in changes:
            if isinstance(change, Dropped | HostDropped):
                h = change.block_hash
                if h not in cached and h not in host:
                    described.pop(h, None)

    def close(self) -> None:
        """Stop publishing (what was flushed still goes out)."""
        self.publisher.close()
