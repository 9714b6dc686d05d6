"""ridge_bench.capacity.doc: the table row of a cell, from results.json values."""

from __future__ import annotations

from pathlib import Path

from ridge_bench.capacity import doc as capacity_doc

BOUNDS = {"unlimited": 0.8, "lru": {"plain": 0.6}, "fleet_kv_tokens": {"plain": 1_656_488},
          "requests": 100, "span_s": 50.0, "prompt_tokens_mean": 13_000.0}
CELL = {"fleet": "plain", "router": "ridge", "saturated": ["sim"],
        "summary": {"goodput_rps": 1.5, "attainment": 0.75, "ttft_p50_s": 0.4, "ttft_p99_s": 2.5},
        "engine_prefix_cache": {"hit_rate": 0.56, "max_mean_requests_per_replica": 1.08},
        "gateway_peak_rss_mb": 96.4}


def test_a_row_reads_the_hit_rate_against_the_bounds() -> None:
    assert capacity_doc.row(CELL, BOUNDS) == (
        "| plain | ridge | 1.66 | 0.600 | 0.560 | 0.70 | 1.50 (0.750) | 0.40 / 2.50 | 1.08 "
        "| 96 | sim saturated |")


def test_missing_figures_are_dashes_and_the_block_is_written(tmp_path: Path) -> None:
    bare = {**CELL, "engine_prefix_cache": None, "saturated": [], "interrupted": True}
    assert capacity_doc.row(bare, BOUNDS).endswith("| – | – | 1.50 (0.750) | 0.40 / 2.50 | – "
                                                   "| 96 | interrupted |")
    doc = tmp_path / "capacity.md"
    doc.write_text("# Capacity\n\nProse.\n")
    results = {"meta": {"trace": "t.jsonl", "seed": 0, "speed": 6.0, "bounds": BOUNDS,
                        "slo": {"ttft_s": 2.0, "tpot_s": 0.1, "e2e_s": 60.0}, "command": "x"},
               "cells": [CELL]}
    capacity_doc.write(doc, results)
    text = doc.read_text()
    assert text.startswith("# Capacity\n\nProse.\n") and "**0.800**" in text
    assert capacity_doc.HEADER in text and text.count("| plain | ridge |") == 1
