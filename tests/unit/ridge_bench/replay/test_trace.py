"""ridge_bench.replay.trace: the shipped traces, the replay's arrivals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ridge_bench.command import options, parser
from ridge_bench.replay.trace import (
    TRACES_DIR,
    conversation_trace,
    load_trace,
    trace_f,
    trace_workload,
)


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


def test_shipped_trace_is_the_generators_and_multi_turn() -> None:
    shipped = [json.loads(line) for line in
               (TRACES_DIR / "conversations.jsonl").read_text().splitlines()]
    assert shipped == conversation_trace()
    assert 150 <= len(shipped) <= 250
    assert trace_f(load_trace(TRACES_DIR / "conversations.jsonl")) > 0.5
