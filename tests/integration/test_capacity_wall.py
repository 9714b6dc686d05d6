"""The capacity wall, seen through ridge in front of the simulator.

Two single-engine vLLM pools serve the same shared-prefix traffic: six long documents asked
about in turn, three rounds. One engine's KV cache holds 4,096 tokens — under three of the
documents — so by the time a document comes round again its blocks were evicted; the other's
holds 64× that. ridge's prefix index predicts the same reuse for both. On the small cache the
engine recomputes what was predicted (``ridge_prefix_lost_tokens_total`` ≈ predicted) and the
pool's binding wall reads ``kv_capacity``; on the large one nearly nothing is lost and the wall
is another. Both engines run with ``--enable-prompt-tokens-details``, so they report their
cached tokens per request as vLLM does with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from backends.sim import start_fleet
from config.fleet import Fleet, parse_fleet
from tests.fakes.harness import RunningRidge, free_ports, quick_settings, running_ridge

FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 4096}
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # 131,072 B
SMALL_TOKENS = 4096
DOCUMENTS = [" ".join(f"Section {d}.{i}: the terms of contract {d} apply here." for i in range(120))
             for d in range(6)]  # ≈ 6,300 characters ≈ 1,600 tokens each


def _pool(name: str, port: int, kv_tokens: int) -> dict[str, Any]:
    hardware = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9,
                "kv_cache_bytes": kv_tokens * KV_PER_TOKEN}
    return {"name": name, "engine": "vllm", "models": [f"m-{name}"], "model": FACTS,
            "hardware": hardware, "levers": {"prefix_caching": True},
            "engine_args": ["--enable-prompt-tokens-details"],
            "endpoints": [f"http://127.0.0.1:{port}"]}


def fleet() -> Fleet:
    small, large = free_ports(2)
    return parse_fleet({"pools": [_pool("small", small, SMALL_TOKENS),
                                  _pool("large", large, 64 * SMALL_TOKENS)]})


@pytest.fixture
async def ridge() -> AsyncIterator[RunningRidge]:
    config = fleet()
    sim = await start_fleet(config, speed=20.0, seed=5)
    try:
        async with running_ridge(config, quick_settings()) as running:
            yield running
    finally:
        await sim.stop()


async def _ask(http: aiohttp.ClientSession, ridge: RunningRidge, model: str, document: str,
               question: int) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 4, "messages": [
        {"role": "system", "content": document},
        {"role": "user", "content": f"Question {question}: what does it say?"}]}
    async with http.post(ridge.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        usage: dict[str, Any] = (await r.json())["usage"]
    return usage


def _value(ridge: RunningRidge, name: str, **labels: str) -> float:
    return ridge.metrics.get_sample_value(name, labels) or 0.0


async def test_reuse_lost_to_eviction_shows_the_capacity_wall(ridge: RunningRidge) -> None:
    cached = {"small": 0, "large": 0}
    async with aiohttp.ClientSession() as http:
        for question in range(18):  # three rounds over the six documents
            document = DOCUMENTS[question % len(DOCUMENTS)]
            for pool in cached:
                usage = await _ask(http, ridge, f"m-{pool}", document, question)
                cached[pool] += usage["prompt_tokens_details"]["cached_tokens"]

    small = {k: _value(ridge, f"ridge_prefix_{k}_tokens_total", pool="small")
             for k in ("predicted", "lost")}
    large = {k: _value(ridge, f"ridge_prefix_{k}_tokens_total", pool="large")
             for k in ("predicted", "lost")}
    # the index predicted the same reuse on both: two rounds of six documents of ≈ 1,600 tokens
    assert small["predicted"] > 12 * 1400 and large["predicted"] > 12 * 1400, (small, large)
    assert small["predicted"] == pytest.approx(large["predicted"], rel=0.02)
    # the small cache recomputed nearly all of it; the large one served it from its cache
    assert small["lost"] > 0.8 * small["predicted"], small
    assert large["lost"] < 0.05 * large["predicted"], large
    assert cached["large"] > 10 * max(cached["small"], 1)

    def wall(pool: str, name: str) -> float:
        return _value(ridge, "ridge_pool_binding_wall", pool=pool, wall=name)

    assert wall("small", "kv_capacity") == 1.0
    assert wall("large", "kv_capacity") == 0.0
    assert sum(wall("large", w) for w in ("compute", "memory_bandwidth",
                                          "prefill_decode_contention", "none")) == 1.0
    # demand: six documents' blocks against 4,096 tokens on the small engine
    assert _value(ridge, "ridge_pool_kv_working_set_tokens", pool="small") > 6 * 1400
    assert _value(ridge, "ridge_pool_kv_demand_ratio", pool="small") > 2.0
    assert _value(ridge, "ridge_pool_kv_demand_ratio", pool="large") < 0.05
