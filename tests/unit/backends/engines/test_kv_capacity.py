"""An engine's KV capacity from the fleet file's facts, with worked numbers."""

from __future__ import annotations

from typing import Any

import pytest

from backends.engines.kv_capacity import engine_cache_tokens, engine_kv_tokens, host_tier_tokens
from config.fleet import parse_fleet


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


def test_a_host_tier_adds_its_tokens_to_the_engines_cache() -> None:
    # 128e9 B of host memory at 131,072 B per token (fp16 Llama-3-8B)
    tiered = pool(levers={"prefix_caching": True, "host_kv_cache": {"size_gb": 128}})
    assert host_tier_tokens(tiered) == int(128e9 // 131_072) == 976_562
    assert engine_cache_tokens(tiered) == 426_788 + 976_562
    # fp8 KV: the host copies are fp8 too, twice the tokens
    fp8 = pool(levers={"prefix_caching": True, "kv_cache_dtype": "fp8",
                       "host_kv_cache": {"size_gb": 128}})
    assert host_tier_tokens(fp8) == int(128e9 // 65_536)
    assert host_tier_tokens(pool()) == 0 and engine_cache_tokens(pool()) == 426_788
    assert engine_cache_tokens(pool(model=None, hardware=None)) is None
