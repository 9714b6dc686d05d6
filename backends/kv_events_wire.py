"""vLLM's KV-cache event wire format, decoded and encoded as vLLM does it.

Transport (``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``): a ZMQ PUB socket sends one
three-frame message per batch, ``(topic, seq, payload)``: ``topic`` the configured topic
(``b""`` by default), ``seq`` the batch number as 8 bytes big-endian (from 0, +1 per batch; it
starts again at 0 when the engine restarts), ``payload`` the batch in msgpack (msgspec). An
optional ROUTER socket (the ``replay_endpoint``) replays the last ``buffer_steps`` batches: a
DEALER sends ``(b"", start_seq)`` (8 bytes big-endian) and receives ``(b"", topic, seq,
payload)`` for every buffered batch from ``start_seq`` on, then ``(b"", b"", END_SEQ, b"")``
with ``END_SEQ`` = −1 as 8 signed bytes.

Schema (msgspec): a batch is an array ``[ts, events, data_parallel_rank]`` (``array_like``,
the rank omitted when None); each event a map tagged ``"type"`` = the class name:
``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``,
``lora_id``, ``medium``, ``lora_name``, optional ``extra_keys`` and cache-spec fields),
``BlockRemoved`` (``block_hashes``, ``medium``), ``AllBlocksCleared``. Block hashes are
``bytes`` (the default) or 64-bit ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``). Fields this
module does not name are ignored on decode, so newer engines' additions do not break it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from routing.kv_events import AllCleared, BlocksRemoved, BlocksStored, KvEvent

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


class Codec:
    """Decodes payloads into :mod:`routing.kv_events` events and encodes them back (the
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


def seq_bytes(seq: int) -> bytes:
    """A batch number as the wire carries it: 8 bytes big-endian."""
    return seq.to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int:
    """The batch number of a ``seq`` frame (−1 for :data:`END_SEQ`)."""
    return int.from_bytes(frame, "big", signed=True)
