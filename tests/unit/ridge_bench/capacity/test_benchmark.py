"""ridge_bench.capacity.benchmark: its cells, the fleets' KV capacity, the matrix it hands the
runner, the plots from saved results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.fleet import load_fleet
from ridge_bench.capacity import benchmark as capacity
from ridge_bench.harness import fleets
from ridge_bench.replay.trace import TRACE


def test_cells_name_a_fleet_and_a_router_and_may_repeat() -> None:
    cells = capacity.parse_cells("plain:ridge, host:sglang_ca,plain:ridge")
    assert [c.name for c in cells] == ["plain:ridge", "host:sglang_ca", "plain:ridge"]
    for bad in ("plain", "tiny:ridge", "plain:nginx"):
        with pytest.raises(ValueError, match="unknown cell"):
            capacity.parse_cells(bad)
    assert capacity.parse_cells(",".join(capacity.DEFAULT_CELLS))
    extra = capacity.extra_fleets(["tiny=some/fleet.yaml"])
    (cell,) = capacity.parse_cells("tiny:ridge", extra)
    assert cell.file == extra["tiny"] and cell.file.is_absolute()
    with pytest.raises(ValueError, match="NAME=FLEET_FILE"):
        capacity.extra_fleets(["a:b=x.yaml"])


def test_every_peer_runs_cache_aware_beside_the_sglang_router_by_default() -> None:
    peers = {name: fleets.ROUTERS[name].peer for name in capacity.GATEWAYS if name != "ridge"}
    assert peers == {"sglang_ca": ("sglang", "cache_aware"), "smg_ca": ("smg", "cache_aware"),
                     "vllm_ca": ("vllm-router", "cache_aware")}
    cells = {c.name for c in capacity.parse_cells(",".join(capacity.DEFAULT_CELLS))}
    for fleet in ("plain", "large-kv"):
        assert {f"{fleet}:{name}" for name in [*peers, "ridge"]} <= cells


def test_fleet_kv_capacity_from_the_fleet_files() -> None:
    # Llama-3-8B fp16 on an L40S under vLLM: 0.9 · 48e9 − 8.03e9 · 2 = 27.14e9 B of KV at
    # 131,072 B per token = 207,061 tokens per replica; fp8 halves the bytes per token; the host
    # tier adds 128e9 B ÷ 131,072 = 976,562 tokens per replica
    tokens = {name: capacity.fleet_capacity_tokens(load_fleet(path))
              for name, path in capacity.FLEETS.items()}
    assert tokens["plain"] == 8 * 207_061
    assert tokens["fp8"] == 8 * 414_123
    assert tokens["host"] == 8 * (207_061 + 976_562)
    assert tokens["large-kv"] == 8 * int(1e12 // 131_072)


def test_the_matrix_replays_the_trace_in_simulated_time() -> None:
    args = capacity.parser().parse_args(["--cells", "plain:ridge,plain:sglang_ca", "--speed", "4",
                                         "--max-requests", "50", "--out", "/nonexistent"])
    cells = capacity.parse_cells(args.cells)
    m = capacity.matrix(cells, args)
    assert m.workloads == (TRACE,) and m.speed == 4.0
    assert m.template.speed == 4.0 and m.template.requests == 50
    assert m.template.replay is not None
    # the replay is 4× faster than the trace; the bound is in simulated seconds
    last = m.template.replay.times_s[49]
    assert m.durations[TRACE] == pytest.approx(last * 4 + 1.0)
    assert m.routers["plain:sglang_ca"].peer == ("sglang", "cache_aware")
    assert m.routers["plain:ridge"].peer is None
    assert m.routers["plain:ridge"].fleet == capacity.FLEETS["plain"]


def test_bounds_of_the_shipped_trace(tmp_path: object) -> None:
    out = capacity.bounds(capacity.TRACE_FILE, 300, {"plain": capacity.FLEETS["plain"]})
    assert out["requests"] == 300
    assert 0 < out["lru"]["plain"] <= out["unlimited"] < 1
    assert out["fleet_kv_tokens"] == {"plain": 8 * 207_061}


def _cell(fleet: str, router: str, records: str | None) -> dict[str, object]:
    return {"fleet": fleet, "router": router, "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
            "summary": {"goodput_rps": 2.0}, "requests_file": records,
            "pools": {"radix": {"goodput_rps": 2.0, "throughput_rps": 2.2}},
            "engine_prefix_cache": {"hit_rate": 0.6, "endpoints": {}}}


def test_from_results_draws_every_cell_and_the_hit_rates_against_the_bounds(
        tmp_path: Path) -> None:
    (tmp_path / "cell").mkdir()
    (tmp_path / "cell" / "requests-1.jsonl").write_text("".join(
        json.dumps({"sent_s": i * 0.5, "pool": "radix", "error": None, "ttft_s": 0.3,
                    "tpot_s": 0.04}) + "\n" for i in range(10)))
    cells = [_cell("plain", "ridge", "cell/requests-1.jsonl"), _cell("fp8", "ridge", None),
             _cell("plain", "ridge", "cell/requests-3.jsonl")]  # a repeat, its records lost
    (tmp_path / "results.json").write_text(json.dumps(
        {"meta": {"requests": 20, "trace": "long-sessions.jsonl"}, "cells": cells}))
    assert capacity.main(["--from-results", str(tmp_path / "results.json"), "--plots",
                          str(tmp_path / "plots")]) == 0
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"capacity-hit-rate.png", "capacity-plain-ridge-ttft-time.png",
            "capacity-plain-ridge-goodput-pools.png", "capacity-fp8-ridge-goodput-pools.png",
            "capacity-plain-ridge-2-goodput-pools.png"} <= names
    assert "capacity-plain-ridge-2-ttft-time.png" not in names
    assert capacity.main(["--from-results", str(tmp_path / "results.json"), "--plots", "",
                          "--out", str(tmp_path / "none")]) == 0
    assert not (tmp_path / "none").exists()
