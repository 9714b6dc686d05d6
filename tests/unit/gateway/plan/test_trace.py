"""gateway.plan.trace: Mooncake records, prompt synthesis, the prefix share."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.plan.trace import BlockTexts, TraceEntry, load_trace, parse_line, trace_f


def test_equal_ids_give_equal_text_of_the_right_length() -> None:
    texts = BlockTexts(seed=3, block_tokens=8)
    a = texts.prompt(TraceEntry(0, 20, 5, (1, 2, 3)))
    b = texts.prompt(TraceEntry(0, 17, 5, (1, 2, 4)))
    assert len(a) == 80 and len(b) == 68
    assert a[:64] == b[:64] and a[64:68] != b[64:68]
    assert texts.prompt(TraceEntry(0, 20, 5, (1, 2, 3))) == a
    assert BlockTexts(seed=4, block_tokens=8).prompt(TraceEntry(0, 20, 5, (1, 2, 3))) != a
    assert len(texts.prompt(TraceEntry(0, 30, 5, (1,)))) == 120  # ids short of the length


def test_lines_must_be_mooncake_records() -> None:
    ok = parse_line('{"timestamp": 5, "input_length": 9, "output_length": 2, "hash_ids": [0]}')
    assert ok == TraceEntry(5.0, 9, 2, (0,))
    for bad in ('[]', '{"timestamp": -1, "input_length": 9, "output_length": 2, "hash_ids": []}',
                '{"timestamp": 0, "input_length": 9, "output_length": 2, "hash_ids": ["a"]}'):
        with pytest.raises(ValueError):
            parse_line(bad)


def test_a_missing_trace_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        load_trace(tmp_path / "missing.jsonl")


def test_a_trace_that_is_not_text_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        load_trace(path)


def test_the_prefix_share_counts_blocks_up_to_the_first_new_one() -> None:
    entries = [TraceEntry(0, 1024, 1, (0, 1)), TraceEntry(1, 1536, 1, (0, 5, 1))]
    assert trace_f(entries) == pytest.approx(512 / 2560)
