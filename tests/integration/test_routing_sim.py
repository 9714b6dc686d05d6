"""The optimization router end to end: ridge in front of a simulated lever fleet.

The route header must show the lever a request's shape calls for, the engines must see it
(prefix-cache hits where ridge sent the shared prefix), and both prefill/decode hand-off
protocols must serve whole answers through ridge.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from backends.sim import start_fleet
from config.fleet import Fleet, parse_fleet
from tests.fakes.harness import RunningRidge, free_ports, running_ridge

MODEL = "llama-3-8b"
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 16384}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}
SYSTEM = " ".join(f"Rule {i}: answer politely, cite sources, and keep to the topic." for i in
                  range(60))  # ≈ 3,800 characters ≈ 950 tokens


def _pool(name: str, engine: str, ports: list[int], **extra: Any) -> dict[str, Any]:
    return {"name": name, "engine": engine, "models": [MODEL], "model": FACTS, "hardware": L4,
            "endpoints": [f"http://127.0.0.1:{p}" for p in ports], **extra}


def lever_fleet() -> Fleet:
    p = free_ports(6)
    return parse_fleet({
        "routing": {"policy": {"busy_load_per_endpoint": 0}},  # any load counts as load
        "pools": [
            _pool("spec", "vllm", p[0:1],
                  levers={"speculative": {"method": "ngram", "num_draft_tokens": 4}}),
            _pool("radix", "sglang", p[1:3], levers={"prefix_caching": True}),
            _pool("chunked", "vllm", p[3:4], levers={
                "prefix_caching": True, "chunked_prefill": {"token_budget": 512}}),
            _pool("pd-prefill", "vllm", p[4:5], role="prefill", pair="pd-decode"),
            _pool("pd-decode", "vllm", p[5:6], role="decode"),
        ],
    })


def sglang_pd_fleet() -> Fleet:
    p = free_ports(3)
    return parse_fleet({
        "routing": {"policy": {"busy_load_per_endpoint": 0}},
        "pools": [
            _pool("mixed", "sglang", p[0:1]),
            _pool("sg-prefill", "sglang", p[1:2], role="prefill", pair="sg-decode"),
            _pool("sg-decode", "sglang", p[2:3], role="decode"),
        ],
    })


@pytest.fixture
async def levers() -> AsyncIterator[RunningRidge]:
    fleet = lever_fleet()
    sim = await start_fleet(fleet, speed=20.0, seed=1)
    try:
        async with running_ridge(fleet) as ridge:
            yield ridge
    finally:
        await sim.stop()


async def _chat(ridge: RunningRidge, messages: list[dict[str, str]], max_tokens: int,
                stream: bool = False) -> tuple[dict[str, str], str]:
    """(route header fields, answer text)."""
    client = openai.AsyncOpenAI(base_url=ridge.url + "/v1", api_key="x", max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, stream=stream)  # type: ignore[call-overload]
        route = _route(raw.headers["x-ridge-route"])
        parsed = raw.parse()
        if stream:
            text = "".join([c.choices[0].delta.content or "" async for c in parsed if c.choices])
        else:
            text = parsed.choices[0].message.content or ""
        return route, text
    finally:
        await client.close()


def _route(header: str) -> dict[str, str]:
    fields = dict(part.split("=", 1) for part in header.split("; ") if "=" in part)
    return fields


async def test_decode_heavy_short_request_goes_to_speculation(levers: RunningRidge) -> None:
    route, text = await _chat(levers, [{"role": "user", "content": "Tell me a story."}], 300)
    assert (route["pool"], route["lever"], route["reason"]) == (
        "spec", "speculative", "low_load_decode_heavy")
    assert text


async def test_shared_system_prompt_follows_its_cache(levers: RunningRidge) -> None:
    first, _ = await _chat(levers, [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": "Question one?"}], 8)
    assert first["lever"] in ("none", "prefix_cache")
    hits_before = await _prefix_hits(levers, first["pool"])
    for i in range(3):
        route, _ = await _chat(levers, [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": f"Question {i + 2}?"}], 8)
        assert (route["pool"], route["lever"], route["reason"]) == (
            first["pool"], "prefix_cache", "long_match"), route
    # the engines of that pool really served the shared prefix from their cache
    assert await _prefix_hits(levers, first["pool"]) > hits_before


async def test_long_uncached_prompt_under_load_is_disaggregated(levers: RunningRidge) -> None:
    document = " ".join(f"Paragraph {i} of a report nobody has sent before." for i in range(250))
    for stream in (False, True):
        route, text = await _chat(
            levers, [{"role": "user", "content": f"{stream} {document} Summarise."}], 12, stream)
        assert (route["pool"], route["decode"], route["lever"]) == (
            "pd-prefill", "pd-decode", "pd_disaggregation"), route
        assert route["reason"] == "long_uncached_under_load"
        assert len(text.split()) >= 6


async def test_sglang_bootstrap_protocol_through_ridge() -> None:
    fleet = sglang_pd_fleet()
    sim = await start_fleet(fleet, speed=20.0, seed=2)
    try:
        async with running_ridge(fleet) as ridge:
            document = " ".join(f"Line {i} of a long contract." for i in range(400))
            for stream in (False, True):
                route, text = await _chat(
                    ridge, [{"role": "user", "content": f"{stream} {document}"}], 10, stream)
                assert (route["pool"], route["decode"]) == ("sg-prefill", "sg-decode"), route
                assert len(text.split()) >= 5
    finally:
        await sim.stop()


async def _prefix_hits(ridge: RunningRidge, pool: str) -> float:
    """The pool's engines' prefix-cache hits so far, read through their /metrics pages."""
    from backends.engines.dialects import dialect_for
    from backends.engines.scrape import normalise

    config = ridge.gateway.fleet.pool(pool)
    total = 0.0
    async with aiohttp.ClientSession() as session:
        for url in config.endpoint_urls():
            async with session.get(url + "/metrics") as r:
                metrics = normalise(await r.text(), dialect_for(config.engine))
            total += metrics.prefix_cache_hits_total or 0.0
    return total


def caching_spec_fleet() -> Fleet:
    """A speculative pool that also caches prefixes (as the demo's), listed first, beside a
    radix pool: on cache cost alone, an idle spec pool ties with radix and wins by order."""
    p = free_ports(3)
    return parse_fleet({"pools": [
        _pool("spec", "vllm", p[0:1], levers={
            "prefix_caching": True, "speculative": {"method": "ngram", "num_draft_tokens": 4}}),
        _pool("radix", "sglang", p[1:3], levers={"prefix_caching": True}),
    ]})


async def _chat_as(ridge: RunningRidge, content: str, session: str | None = None
                   ) -> dict[str, str]:
    headers = {"x-session-id": session} if session else {}
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    async with aiohttp.ClientSession() as http, http.post(
            ridge.url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        header = r.headers["x-ridge-route"]
    route = _route(header)
    detail = header.rsplit("; ", 1)[-1]  # f=0.80,match=0/160[,session=radix]
    return {**route, **dict(f.split("=", 1) for f in detail.split(","))}


async def test_request_evidence_decides_the_prefix_lever_not_the_workloads_f() -> None:
    fleet = caching_spec_fleet()
    sim = await start_fleet(fleet, speed=20.0, seed=3)
    try:
        async with running_ridge(fleet) as ridge:
            for i in range(4):  # shared-prefix traffic raises the model's prefix share f
                await _chat_as(ridge, f"{SYSTEM} Question {i}?")
            # a long unique prompt with a short answer: nothing cached, no session
            unique = " ".join(f"Clause {i} of a contract nobody sent before." for i in range(240))
            route = await _chat_as(ridge, unique)
            assert (route["pool"], route["lever"], route["reason"]) == (
                "radix", "prefix_cache", "high_prefix_share"), route
            assert route["match"].startswith("0/") and float(route["f"]) >= 0.5, route
            # a session's follow-up, with no prefix shared, returns to where it last ran
            first = await _chat_as(ridge, "Hello there, first turn.", session="conv-7")
            again = await _chat_as(ridge, "Something else entirely.", session="conv-7")
            assert again["reason"] == "session_follow_up", again
            assert again["pool"] == first["pool"] == again["session"], (first, again)
    finally:
        await sim.stop()
