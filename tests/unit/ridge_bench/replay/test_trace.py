"""ridge_bench.replay.trace: trace parsing, prompt synthesis, the replay's arrivals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ridge_bench.command import options, parser
from ridge_bench.replay.trace import (
    TRACES_DIR,
    BlockTexts,
    TraceEntry,
    conversation_trace,
    load_trace,
    parse_line,
    trace_f,
    trace_workload,
)


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


def test_replay_sorts_rebases_and_compresses(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [(3000, [0, 1]), (1000, [0]), (2000, [0, 2])]
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 512 * len(ids),
                                        "output_length": 4, "hash_ids": ids}) + "\n"
                            for t, ids in rows))
    workload = trace_workload(path, speedup=2.0)
    assert [a.at_s for a in workload.arrivals(10)] == [0.0, 0.5, 1.0]
    assert [a.at_s for a in workload.arrivals(2)] == [0.0, 0.5]
    assert trace_f(load_trace(path)) == pytest.approx((0 + 512 + 512) / (512 * 5))
    opts = options(parser().parse_args(["--trace", str(path), "--speedup", "2"]))
    assert (opts.requests, opts.duration_s > 1.0, opts.replay is not None) == (3, True, True)
    opts = options(parser().parse_args(["--trace", str(path), "--max-requests", "2",
                                        "--max-seconds", "0.7"]))
    assert (opts.requests, opts.duration_s) == (2, 0.7)


def test_a_missing_trace_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        load_trace(tmp_path / "missing.jsonl")


def test_shipped_trace_is_the_generators_and_multi_turn() -> None:
    shipped = [json.loads(line) for line in
               (TRACES_DIR / "conversations.jsonl").read_text().splitlines()]
    assert shipped == conversation_trace()
    assert 150 <= len(shipped) <= 250
    assert trace_f(load_trace(TRACES_DIR / "conversations.jsonl")) > 0.5
