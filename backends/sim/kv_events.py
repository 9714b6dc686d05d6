"""The simulator's KV-cache events: what its prefix cache stores and evicts, reported as vLLM 0.32
reports its own (``vllm/v1/core/block_pool.py``, ``vllm/v1/core/sched/scheduler.py``).

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
from collections.abc import Callable, Sequence
from typing import Protocol

from backends.kv_events_wire import Codec
from backends.sim.kvcache import BlockPool, CacheChange, Dropped, HostDropped, HostStored, Named
from backends.sim.request import SimRequest
from routing.kv_events import MEDIUM_DEVICE, BlocksRemoved, BlocksStored, KvEvent
from routing.prompt_tokens import PromptTokenizer

MEDIUM_HOST = "CPU"
"""The medium vLLM's offloading connector names its host-memory tier (``MEDIUM_CPU``)."""
MAX_TEXTS = 65_536
"""Generated-token texts whose id :class:`TokenIds` remembers."""


def block_key(block_hash: int) -> bytes:
    """The 32-byte hash a block is published under (module docstring)."""
    return hashlib.sha256(block_hash.to_bytes(8, "big", signed=True)).digest()


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


def events_of(changes: Sequence[CacheChange], block_size: int, ids: TokenIds) -> list[KvEvent]:
    """One step's events from its cache changes: the device's in order, then the host
    tier's (module docstring)."""
    device: list[KvEvent] = []
    host: list[KvEvent] = []
    run: list[Named] = []
    for change in changes:
        if isinstance(change, HostStored):
            host.append(BlocksStored([block_key(change.block_hash)], None, [], 0, MEDIUM_HOST))
        elif isinstance(change, HostDropped):
            host.append(BlocksRemoved([block_key(change.block_hash)], MEDIUM_HOST))
        elif isinstance(change, Named) and (not run or _continues(run[-1], change)):
            run.append(change)
        else:
            if run:
                _add_stored(device, run, block_size, ids)
            run = [change] if isinstance(change, Named) else []
            if isinstance(change, Dropped):
                device.append(BlocksRemoved([block_key(change.block_hash)], MEDIUM_DEVICE))
    if run:
        _add_stored(device, run, block_size, ids)
    return device + host


def _continues(last: Named, change: Named) -> bool:
    return change.owner is last.owner and change.index == last.index + 1


def _add_stored(out: list[KvEvent], run: list[Named], block_size: int, ids: TokenIds) -> None:
    """The BlocksStored for ``run`` (blocks of one request, in chain order), if its tokens
    have ids."""
    owner, first = run[0].owner, run[0].index
    if not isinstance(owner, SimRequest):
        return
    token_ids = ids.span(owner, first * block_size, (run[-1].index + 1) * block_size)
    if token_ids is None:
        return
    parent = block_key(owner.hashes[first - 1]) if first else None
    out.append(BlocksStored([block_key(c.block_hash) for c in run], parent, token_ids,
                            block_size, MEDIUM_DEVICE))


class Publisher(Protocol):
    """Where batches go (:class:`backends.sim.kv_publisher.ZmqPublisher`)."""

    def publish(self, payload: bytes) -> None: ...

    def close(self) -> None: ...


class SimKvEvents:
    """One simulated engine's KV-cache events: :meth:`flush` after each step publishes the
    step's changes as one batch (module docstring). ``wall_clock``: the batches' time stamps
    [s since the epoch]."""

    def __init__(self, pool: BlockPool, ids: TokenIds, publisher: Publisher,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.publisher = publisher
        self._ids = ids
        self._codec = Codec()
        self._wall_clock = wall_clock
        pool.record_changes()

    def flush(self) -> None:
        """Publish the changes since the last call as one batch (nothing when there are none)."""
        changes = self.pool.take_changes()
        if not changes:
            return
        events = events_of(changes, self.pool.block_size, self._ids)
        if events:
            self.publisher.publish(self._codec.encode(self._wall_clock(), events))

    def close(self) -> None:
        """Stop publishing (what was flushed still goes out)."""
        self.publisher.close()
