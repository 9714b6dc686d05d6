"""The precise prefix path end to end: simulated engines publish their KV-cache events (vLLM's
ZMQ transport and schema; SGLang's schema and one-token pages, which ridge accumulates into its
16-token router blocks), ridge subscribes, and routes on what the engines hold. Each test runs
once per engine.

Two pools serve the model: ``cache`` (prefix caching, KV events, two replicas on one host, so
each names its own event addresses) and ``general`` (neither). A conversation's follow-up must
go to the replica that served its opening, as a ``long_match`` the engines' events showed
(``index=events``); after the engine evicts it (a small KV cache and other traffic), the match
must be gone from ridge's view too.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("tokenizers")

from backends.sim import start_fleet  # noqa: E402
from config.fleet import Fleet, parse_fleet  # noqa: E402
from tests.fakes.harness import RunningRidge, free_ports, running_ridge  # noqa: E402
from tests.fakes.tiny_model import model_folder  # noqa: E402

MODEL = "m"
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 1024}
BLOCKS = 96  # KV blocks of 16 tokens per cache replica
KV_BYTES = 131_072  # [B/token] of those facts: 2 · 32 · 8 · 128 · 2
HARDWARE = {"name": "a100-80gb", "kv_cache_bytes": BLOCKS * 16 * KV_BYTES}
WORDS = ("hello", "world", "you", "are", "terse", "tool")


def text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def fleet(folder: Path, engine: str = "vllm") -> Fleet:
    http = free_ports(7)
    cache_urls = [f"http://127.0.0.1:{p}" for p in http[:2]]
    return parse_fleet({
        "routing": {"features": {"tokenizers": {MODEL: str(folder)}}},
        "pools": [
            {"name": "cache", "engine": engine, "models": [MODEL], "endpoints": cache_urls,
             "levers": {"prefix_caching": True}, "model": FACTS, "hardware": HARDWARE,
             "kv_events": {"port": http[2], "addresses": [f"tcp://127.0.0.1:{http[3]}",
                                                          f"tcp://127.0.0.1:{http[4]}"],
                           "replay_addresses": [f"tcp://127.0.0.1:{http[5]}",
                                                f"tcp://127.0.0.1:{http[6]}"]}},
            {"name": "general", "engine": engine, "models": [MODEL], "model": FACTS,
             "hardware": HARDWARE, "endpoints": [f"http://127.0.0.1:{free_ports(1)[0]}"]},
        ],
    })  # fmt: skip


@pytest.fixture(params=["vllm", "sglang"])
async def ridge(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[RunningRidge]:
    served = fleet(model_folder(tmp_path / "model"), request.param)
    sim = await start_fleet(served, speed=20.0, seed=3)
    try:
        async with running_ridge(served) as running:
            yield running
    finally:
        await sim.stop()


async def chat(base_url: str, content: str) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    async with httpx.AsyncClient(timeout=30) as client:
        reply = await client.post(base_url + "/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    return reply


async def routed(ridge: RunningRidge, content: str) -> tuple[dict[str, str], str]:
    """(the route header's fields, its detail's included; the endpoint's URL) of one short
    answer."""
    reply = await chat(ridge.url, content)
    *parts, detail = reply.headers["x-ridge-route"].split("; ")
    route: dict[str, str] = dict(part.split("=", 1) for part in parts)
    for field in detail.split(","):
        key, _, value = field.partition("=")
        route[key] = value
    pool = next(p for p in ridge.gateway.fleet.pools if p.name == route["pool"])
    return route, pool.endpoint_urls()[int(reply.headers["x-ridge-endpoint"])]


def matched(route: dict[str, str]) -> int:
    return int(route.get("match", "0/0").split("/")[0])


def metric(ridge: RunningRidge, name: str, **labels: str) -> float:
    return ridge.metrics.get_sample_value(name, labels or None) or 0.0


async def until(condition: Callable[[], Any], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_follow_ups_go_where_the_engine_holds_their_prefix(ridge: RunningRidge) -> None:
    opening = text(400, 1)
    route, served_on = await routed(ridge, opening + " hello")
    assert route["pool"] in ("cache", "general")
    if route["pool"] == "general":  # a first turn may seed either pool: seed the cache's
        served_on = ridge.gateway.fleet.pools[0].endpoint_urls()[0]
        await chat(served_on, opening + " hello")
    await until(lambda: metric(ridge, "ridge_kv_event_index_blocks") >= 24)
    for i in range(3):
        route, endpoint = await routed(ridge, opening + f" {WORDS[i]} tool")
        assert (route["pool"], route["reason"], endpoint) == ("cache", "long_match", served_on)
        assert matched(route) >= 24 and route["index"] == "events", route
    assert metric(ridge, "ridge_kv_events_batches_total", endpoint=served_on) > 0


async def test_an_evicted_prefix_is_no_longer_matched(ridge: RunningRidge) -> None:
    opening = text(400, 2)
    cache = ridge.gateway.fleet.pools[0].endpoint_urls()
    for url in cache:  # both replicas hold the opening
        await chat(url, opening)
    await until(lambda: metric(ridge, "ridge_kv_event_index_blocks") >= 48)
    route, _ = await routed(ridge, opening + " hello")
    assert route["reason"] == "long_match" and matched(route) >= 24, route
    for seed in range(10, 16):  # another gateway's long prompts fill both replicas' 96 blocks
        for url in cache:
            await chat(url, text(600, seed))
    await until(lambda: metric(ridge, "ridge_kv_event_index_blocks") <= 2 * BLOCKS)
    route, _ = await routed(ridge, opening + " hello")
    assert route["reason"] != "long_match" and matched(route) < 24, route
    for url in cache:
        assert metric(ridge, "ridge_kv_events_resets_total", endpoint=url) == 0
