from __future__ import annotations

from pathlib import Path

import pytest

from ridge_bench.overhead.scaling import (
    ScalingWindow,
    markdown,
    rotated,
    summary,
    target,
    write_doc,
)


def test_target_passes_the_worker_count() -> None:
    assert target(2).workers == 2 and target(2).kind == "ridge"


def test_summary_takes_medians_and_derives_speedup_and_cpu_scaling() -> None:
    windows = [  # 1 worker: 1,000 req/s at 250 µs; 2 workers: 1,500 req/s at 300 µs
        ScalingWindow(0, 1, ok=1000, wall_s=1.0, gateway_cpu_s=0.25),
        ScalingWindow(1, 1, ok=1200, wall_s=1.0, gateway_cpu_s=0.30),  # 250 µs again
        ScalingWindow(2, 1, ok=900, wall_s=1.0, gateway_cpu_s=0.25, errors=1),
        ScalingWindow(0, 2, ok=1500, wall_s=1.0, gateway_cpu_s=0.45),
    ]
    out = summary(windows)
    assert out[1]["rps"] == 1000 and out[1]["errors"] == 1 and out[1]["rounds"] == 3
    assert out[1]["cpu_us"] == pytest.approx(250.0)
    assert out[2]["speedup"] == pytest.approx(1.5)
    assert out[2]["cpu_scaling"] == pytest.approx(2 * 250 / 300)  # 1.67: sharing costs 20 %
    assert out[1]["speedup"] == pytest.approx(1.0) and out[1]["cpu_scaling"] == pytest.approx(1.0)


def test_a_missing_cpu_reading_gives_no_scaling() -> None:
    out = summary([ScalingWindow(0, 1, ok=10, wall_s=1.0), ScalingWindow(0, 2, ok=20, wall_s=1.0)])
    assert out[2]["cpu_scaling"] is None and out[2]["speedup"] == pytest.approx(2.0)


def test_rounds_rotate() -> None:
    assert rotated([1, 2, 4], 1) == [2, 4, 1]


def _data() -> dict[str, object]:
    windows = [ScalingWindow(0, 1, ok=1000, wall_s=1.0, gateway_cpu_s=0.25),
               ScalingWindow(0, 2, ok=1800, wall_s=1.0, gateway_cpu_s=0.5)]
    meta = {"ridge": "abc1234", "started": "now",
            "command": "python -m ridge_bench.overhead.scaling",
            "machine": "2 cores", "rounds": 1, "seconds": 6.0, "wrk_threads": 2,
            "connections": 256}
    return {"meta": meta, "summary": {str(k): v for k, v in summary(windows).items()}}


def test_the_doc_block_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    doc = tmp_path / "overhead.md"
    doc.write_text("# head\n\ntext\n")
    write_doc(doc, _data())
    first = doc.read_text()
    assert first.startswith("# head\n\ntext\n") and "| 2 | 1,800 | 1.80× | 278 | 1.80× |" in first
    doc.write_text(first + "\nafter\n")
    write_doc(doc, _data())
    again = doc.read_text()
    assert again.count("overhead:workers:begin") == 1 and again.endswith("after\n")
    assert markdown(_data()) in again
