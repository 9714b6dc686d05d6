"""The engines' KV-cache event wire formats, decoded and encoded as the engines do it.

Which format an engine kind speaks is data: :data:`WIRE_FORMATS` (engine name → its
:class:`WireFormat`: a payload codec and how its replay socket answers), read by the gateway's
subscribers and the simulator's publishers alike.

The transport is vLLM's, which SGLang shares frame for frame: a ZMQ PUB socket sends
``(topic, seq, payload)`` per batch (``seq`` 8 bytes big-endian, from 0 at every engine start),
an optional ROUTER socket replays buffered batches from a given ``seq`` and ends with
``END_SEQ``. Payloads are msgpack: a batch ``[ts, events, rank]`` of ``BlockStored``,
``BlockRemoved`` and ``AllBlocksCleared`` events, decoded into :mod:`routing.kv_events.events`;
fields not named here are ignored, so newer engines' additions do not break decoding. SGLang's
pages that cannot be matched by tokens decode with ``plain`` False; :class:`SglangCodec` and
:attr:`WireFormat.bare_replay` also take earlier SGLang's array-encoded events and topic-less
replays. See docs/backends.md#wire-formats for each engine's schema and sources.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import msgspec

from routing.kv_events.events import AllCleared, BlocksRemoved, BlocksStored, KvEvent

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay socket's end-of-replay sequence number."""

BlockHash = bytes | int


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[BlockHash]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def _plain(event: BlockStored) -> bool:
    """True when the blocks' hashes cover only their tokens (no LoRA, images, salt)."""
    extras = event.extra_keys
    return (event.lora_id is None and event.lora_name is None
            and (not extras or all(not keys for keys in extras)))


def _decoded(event: BlockStored | BlockRemoved | AllBlocksCleared) -> KvEvent:
    if isinstance(event, BlockStored):
        return BlocksStored(event.block_hashes, event.parent_block_hash, event.token_ids,
                            event.block_size, event.medium, _plain(event))
    if isinstance(event, BlockRemoved):
        return BlocksRemoved(event.block_hashes, event.medium)
    return AllCleared()


class EventCodec(Protocol):
    """An engine's payload format: ``decode`` a payload into (batch time [s since the epoch],
    its events), raising ``msgspec.DecodeError`` on one that is not a batch; ``encode`` the
    payload the engine would send for ``events`` at ``ts`` (the simulator publishes with it)."""

    def decode(self, payload: bytes) -> tuple[float, list[KvEvent]]: ...

    def encode(self, ts: float, events: list[KvEvent]) -> bytes: ...


class Codec:
    """vLLM's payloads, decoded into :mod:`routing.kv_events.events` events and encoded back (the
    simulator publishes with it). One per thread or task; not shared across threads."""

    def __init__(self) -> None:
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self._encoder = msgspec.msgpack.Encoder()

    def decode(self, payload: bytes) -> tuple[float, list[KvEvent]]:
        """(batch time [s since the epoch], its events). Raises ``msgspec.DecodeError`` on a
        payload that is not a batch."""
        batch = self._decoder.decode(payload)
        return batch.ts, [_decoded(event) for event in batch.events]

    def encode(self, ts: float, events: list[KvEvent]) -> bytes:
        """The payload vLLM would send for ``events`` at ``ts``."""
        return self._encoder.encode(KVEventBatch(ts, [_encoded(event) for event in events]))


def _encoded(event: KvEvent) -> BlockStored | BlockRemoved | AllBlocksCleared:
    if isinstance(event, BlocksStored):
        return BlockStored(list(event.block_hashes), event.parent,  # type: ignore[arg-type]
                           list(event.token_ids), event.block_size, None, event.medium)
    if isinstance(event, BlocksRemoved):
        return BlockRemoved(list(event.block_hashes), event.medium)  # type: ignore[arg-type]
    return AllBlocksCleared()


# -- SGLang ------------------------------------------------------------------------------------
# SGLang 0.5.23's classes (``sglang/srt/disaggregation/kv_events.py``), under their wire names.

SglTokens = list[int | list[int]]
"""A page's ``token_ids``: ints, or ``[id, next id]`` pairs for EAGLE's bigram keys."""


class SglBlockStored(msgspec.Struct, tag="BlockStored", omit_defaults=True, gc=False):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: SglTokens
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class SglBlockRemoved(msgspec.Struct, tag="BlockRemoved", omit_defaults=True, gc=False):
    block_hashes: list[int]
    medium: str | None = None


class SglAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", omit_defaults=True,
                          gc=False):
    pass


SglEvent = SglBlockStored | SglBlockRemoved | SglAllBlocksCleared


class SglKVEventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[SglEvent]
    attn_dp_rank: int | None = None


class SglArrayStored(msgspec.Struct, tag="BlockStored", array_like=True, omit_defaults=True,
                     gc=False):
    """Earlier SGLang's ``BlockStored``, a tagged array (module docstring)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: SglTokens
    block_size: int
    lora_id: int | None
    medium: str | None = None


class SglArrayRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, omit_defaults=True,
                      gc=False):
    block_hashes: list[int]
    medium: str | None = None


class SglArrayCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True,
                      omit_defaults=True, gc=False):
    pass


class SglArrayBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[SglArrayStored | SglArrayRemoved | SglArrayCleared]
    attn_dp_rank: int | None = None


def _sgl_decoded(event: SglEvent | SglArrayStored | SglArrayRemoved | SglArrayCleared
                 ) -> KvEvent:
    if isinstance(event, SglBlockStored | SglArrayStored):
        ids = event.token_ids
        flat = all(type(t) is int for t in ids)
        plain = flat and event.lora_id is None and (
            not isinstance(event, SglBlockStored)
            or (event.cache_salt is None and event.lora_name is None))
        return BlocksStored(event.block_hashes, event.parent_block_hash,
                            ids if flat else [], event.block_size,  # type: ignore[arg-type]
                            event.medium, plain)
    if isinstance(event, SglBlockRemoved | SglArrayRemoved):
        return BlocksRemoved(event.block_hashes, event.medium)
    return AllCleared()


def _sgl_encoded(event: KvEvent) -> SglEvent:
    if isinstance(event, BlocksStored):
        return SglBlockStored(list(event.block_hashes), event.parent,  # type: ignore[arg-type]
                              list(event.token_ids), event.block_size, None, event.medium)
    if isinstance(event, BlocksRemoved):
        return SglBlockRemoved(list(event.block_hashes), event.medium)  # type: ignore[arg-type]
    return SglAllBlocksCleared()


class SglangCodec:
    """SGLang's payloads (module docstring): decodes SGLang 0.5.23's tagged maps and earlier
    SGLang's tagged arrays, trying first the encoding the last payload had; encodes as 0.5.23
    (rank 0). One per thread or task; not shared across threads."""

    def __init__(self, rank: int = 0) -> None:
        self._decoders: list[msgspec.msgpack.Decoder[Any]] = [
            msgspec.msgpack.Decoder(SglKVEventBatch), msgspec.msgpack.Decoder(SglArrayBatch)]
        self._encoder = msgspec.msgpack.Encoder()
        self._rank = rank

    def decode(self, payload: bytes) -> tuple[float, list[KvEvent]]:
        """(batch time [s since the epoch], its events). Raises ``msgspec.DecodeError`` on a
        payload that is a batch in neither encoding (the error of the encoding tried first)."""
        batch = self._batch(payload)
        return batch.ts, [_sgl_decoded(event) for event in batch.events]

    def _batch(self, payload: bytes) -> SglKVEventBatch | SglArrayBatch:
        first, second = self._decoders
        try:
            return first.decode(payload)  # type: ignore[no-any-return]
        except msgspec.DecodeError as exc:
            error = exc
        try:
            batch = second.decode(payload)
        except msgspec.DecodeError:
            raise error from None
        self._decoders.reverse()
        return batch  # type: ignore[no-any-return]

    def encode(self, ts: float, events: list[KvEvent]) -> bytes:
        """The payload SGLang 0.5.23 would send for ``events`` at ``ts``."""
        batch = SglKVEventBatch(ts, [_sgl_encoded(event) for event in events], self._rank)
        return self._encoder.encode(batch)


# -- the engine table ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WireFormat:
    """How one engine kind publishes its KV-cache events: ``codec`` makes a payload codec
    (one per subscriber or publisher); ``bare_replay``: its replay socket may answer without
    the topic frame, ``(b"", seq, payload)`` ending with ``(b"", END_SEQ, b"")``, besides the
    usual ``(b"", topic, seq, payload)`` and ``(b"", b"", END_SEQ, b"")``."""

    codec: Callable[[], EventCodec]
    bare_replay: bool = False


WIRE_FORMATS: Mapping[str, WireFormat] = MappingProxyType({
    "vllm": WireFormat(Codec),
    "sglang": WireFormat(SglangCodec, bare_replay=True),
})  # fmt: skip
"""Engine name (:class:`config.engines.Engine`'s values) → its wire format; the engines
ridge reads KV-cache events from are exactly its keys."""


def seq_bytes(seq: int) -> bytes:
    """A batch number as the wire carries it: 8 bytes big-endian."""
    return seq.to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int:
    """The batch number of a ``seq`` frame (−1 for :data:`END_SEQ`)."""
    return int.from_bytes(frame, "big", signed=True)
