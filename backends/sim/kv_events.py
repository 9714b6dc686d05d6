"""The simulator's KV-cache events: what its prefix cache stores and evicts, reported as its
engine reports its own, vLLM's or SGLang's, chosen by the pool's engine from :data:`SIM_FORMATS`.

:class:`SimKvEvents` turns the cache's changes (:mod:`backends.sim.kvcache`) into the engine's
events, one batch per step that changed anything: ``BlockStored`` for each run of blocks named
in a row for one request (pages joined as SGLang's recorder joins them), ``BlockRemoved`` for
evictions, the host tier's stores and drops in the engine's own form (vLLM's placeholders,
medium ``CPU``; SGLang's full events, ``CPU_PINNED``), never ``AllBlocksCleared``. Block
hashes are 32 bytes for vLLM (:func:`block_key`) and signed 64-bit ints for SGLang
(:func:`page_key`), stable for the process's life.

Token ids are the model tokenizer's (:class:`TokenIds`); a generated word gets the id its text
has alone (:func:`alone_id`). A prompt without ids is not announced, and a pool without its
model's tokenizer cannot publish events at all (:mod:`backends.sim.fleet`).
See docs/simulator.md#the-events-each-engine-sends for each engine's sources.
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
from config.engines import Engine
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
