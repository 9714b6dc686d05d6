"""The ``cpu-smollm2`` profile against the real vLLM CPU server's figures (ground_truth_cpu.json),
on virtual time."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from backends.sim.virtual import simulate
from tests.unit.backends.sim.sim_helpers import make_core, make_pool, make_request


@pytest.fixture(scope="module")
def truth() -> dict[str, Any]:
    text = resources.files("backends.sim.profiles").joinpath("ground_truth_cpu.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _core(truth: dict[str, Any]):  # type: ignore[no-untyped-def]
    pool = make_pool(
        engine=truth["engine"],
        model=truth["model"],
        hardware=truth["profile"],
        prefix_caching=True,
        chunk=4096,
    )
    return make_core(pool)


def _close(measured: float, expected: float, tolerance: float) -> bool:
    return abs(measured - expected) <= tolerance * expected


def test_short_prompt_time_to_first_token(truth: dict[str, Any]) -> None:
    case = truth["short_prompt"]
    trace = simulate(_core(truth), [(0.0, make_request("a", case["prompt_tokens"], 1))])
    assert _close(trace.first_token("a"), case["ttft_s"], truth["tolerance"])


def test_single_stream_decode_rate(truth: dict[str, Any]) -> None:
    case = truth["single_stream"]
    trace = simulate(
        _core(truth), [(0.0, make_request("a", case["prompt_tokens"], case["max_tokens"]))]
    )
    rate = (case["max_tokens"] - 1) / (trace.last_token("a") - trace.first_token("a"))
    assert _close(rate, case["decode_tokens_per_s"], truth["tolerance"])


def test_four_concurrent_streams_total_rate(truth: dict[str, Any]) -> None:
    case = truth["four_concurrent"]
    reqs = [
        make_request(f"r{i}", case["prompt_tokens"], case["max_tokens"])
        for i in range(case["streams"])
    ]
    trace = simulate(_core(truth), [(0.0, r) for r in reqs])
    total = sum(
        (case["max_tokens"] - 1) / (trace.last_token(r.rid) - trace.first_token(r.rid))
        for r in reqs
    )
    assert _close(total, case["total_decode_tokens_per_s"], truth["tolerance"])


def test_long_prompt_cold_and_with_a_cached_prefix(truth: dict[str, Any]) -> None:
    case = truth["long_prompt"]
    core = _core(truth)
    shared = "S" * (4 * case["cached_tokens"])
    cold = simulate(core, [(0.0, make_request("a", case["prompt_tokens"], 1, prefix=shared))])
    warm = simulate(core, [(0.0, make_request("b", case["prompt_tokens"], 1, prefix=shared))])
    assert core.stats.prefix_hits == case["cached_tokens"]
    assert _close(cold.first_token("a"), case["cold_ttft_s"], truth["tolerance"])
    assert _close(warm.first_token("b"), case["warm_ttft_s"], truth["tolerance"])


def test_kv_capacity_matches_the_real_cache_config(truth: dict[str, Any]) -> None:
    # the captured page: num_gpu_blocks 364, block_size 128 (kv_cache_size_tokens 46592)
    core = _core(truth)
    assert (core.pool.num_blocks, core.pool.block_size) == (364, 128)
