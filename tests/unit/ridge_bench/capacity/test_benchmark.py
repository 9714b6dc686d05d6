"""ridge_bench.capacity.benchmark: its cells, the fleets' KV capacity, the matrix it hands the
runner."""

from __future__ import annotations

import pytest

from config.fleet import load_fleet
from ridge_bench.capacity import benchmark as capacity
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
    assert m.routers["plain:sglang_ca"].sglang_policy == "cache_aware"
    assert m.routers["plain:ridge"].sglang_policy is None
    assert m.routers["plain:ridge"].fleet == capacity.FLEETS["plain"]


def test_bounds_of_the_shipped_trace(tmp_path: object) -> None:
    out = capacity.bounds(capacity.TRACE_FILE, 300, {"plain": capacity.FLEETS["plain"]})
    assert out["requests"] == 300
    assert 0 < out["lru"]["plain"] <= out["unlimited"] < 1
    assert out["fleet_kv_tokens"] == {"plain": 8 * 207_061}
