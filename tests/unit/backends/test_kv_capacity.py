"""An engine's KV capacity from the fleet file's facts, with worked numbers."""

from __future__ import annotations

from typing import Any

import pytest

from backends.fleet_file import parse_fleet
from backends.kv_capacity import engine_kv_tokens


def pool(**over: Any) -> Any:
    raw = {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": ["http://h:1"],
           "model": "llama-3-8b", "hardware": "a100-80gb", **over}
    return parse_fleet({"pools": [raw]}).pools[0]


def test_worked_numbers() -> None:
    # 0.9 · 80e9 − 8.03e9 · 2 = 55.94e9 B at 2 · 32 · 8 · 128 · 2 = 131,072 B per token
    assert engine_kv_tokens(pool()) == int((0.9 * 80e9 - 8.03e9 * 2) // 131_072)
    assert engine_kv_tokens(pool()) == pytest.approx(426_788, abs=1)
    # fp8 KV: 65,536 B per token, twice the tokens
    fp8 = engine_kv_tokens(pool(levers={"kv_cache_dtype": "fp8"}))
    assert fp8 == int((0.9 * 80e9 - 8.03e9 * 2) // 65_536)
    # SGLang takes 0.88 of the memory
    assert engine_kv_tokens(pool(engine="sglang")) == int((0.88 * 80e9 - 8.03e9 * 2) // 131_072)


def test_given_kv_bytes_win_and_unknowns_are_none() -> None:
    given = {"name": "x", "peak_flops": 1e12, "mem_bandwidth": 1e11, "kv_cache_bytes": 2**30}
    assert engine_kv_tokens(pool(hardware=given)) == 2**30 // 131_072  # 8,192 tokens
    unknown = {"name": "my-box", "peak_flops": 1e12, "mem_bandwidth": 1e11}
    assert engine_kv_tokens(pool(hardware=unknown)) is None
    assert engine_kv_tokens(pool(model=None, hardware=None)) is None
