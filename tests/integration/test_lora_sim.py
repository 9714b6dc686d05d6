"""LoRA adapters end to end: ridge in front of simulated vLLM engines, one pool declaring an
adapter and one without it, talked to with the official ``openai`` client.

A request naming the adapter must reach only the pool that has it (a vLLM engine without the
adapter answers 404 for it), an unknown adapter is OpenAI's 404 ``model_not_found`` from ridge
itself, and ``/v1/models`` lists the adapter with its base model as ``parent``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from backends.sim import start_fleet
from config.fleet import Fleet, parse_fleet
from tests.fakes.harness import RunningRidge, free_ports, running_ridge

MODEL = "llama-3-8b"
ADAPTER = "sql-lora"
FACTS = {"params": 8.03e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2, "max_context": 4096}
L4 = {"name": "l4", "peak_flops": 121e12, "mem_bandwidth": 300e9}


def _pool(name: str, ports: list[int], **extra: Any) -> dict[str, Any]:
    return {"name": name, "engine": "vllm", "models": [MODEL], "model": FACTS, "hardware": L4,
            "endpoints": [f"http://127.0.0.1:{p}" for p in ports], **extra}


def lora_fleet() -> Fleet:
    p = free_ports(3)
    return parse_fleet({"pools": [
        _pool("plain", p[0:1]),
        _pool("lora", p[1:3], adapters=[{"name": ADAPTER, "path": "/adapters/sql", "rank": 8}]),
    ]})


@pytest.fixture
async def ridge() -> AsyncIterator[RunningRidge]:
    fleet = lora_fleet()
    sim = await start_fleet(fleet, speed=20.0, seed=3)
    try:
        async with running_ridge(fleet) as running:
            yield running
    finally:
        await sim.stop()


def _client(ridge: RunningRidge) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=ridge.url + "/v1", api_key="x", max_retries=0)


def _pool_of(route: str) -> str:
    fields = dict(part.split("=", 1) for part in route.split("; ") if "=" in part)
    return fields["pool"]


async def test_chat_with_the_adapter_reaches_only_the_pool_that_has_it(
    ridge: RunningRidge
) -> None:
    client = _client(ridge)
    try:
        for i in range(6):
            raw = await client.chat.completions.with_raw_response.create(
                model=ADAPTER, messages=[{"role": "user", "content": f"Query {i}?"}],
                max_tokens=8)
            assert _pool_of(raw.headers["x-ridge-route"]) == "lora"
            answer = raw.parse()
            assert answer.model == ADAPTER and answer.choices[0].message.content
        stream = await client.chat.completions.create(
            model=ADAPTER, messages=[{"role": "user", "content": "Stream it."}], max_tokens=8,
            stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text
    finally:
        await client.close()


async def test_an_unknown_adapter_is_openais_404(ridge: RunningRidge) -> None:
    client = _client(ridge)
    try:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(
                model="other-lora", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert caught.value.code == "model_not_found"
    finally:
        await client.close()


async def test_the_model_list_shows_the_adapter_with_its_base_model(ridge: RunningRidge) -> None:
    client = _client(ridge)
    try:
        cards = {m.id: m for m in (await client.models.list()).data}
        assert set(cards) == {MODEL, ADAPTER}
        assert getattr(cards[ADAPTER], "parent", None) == MODEL
        assert getattr(cards[MODEL], "parent", "unset") is None
        assert getattr(await client.models.retrieve(ADAPTER), "parent", None) == MODEL
    finally:
        await client.close()
    # the registry also learned it from the engines' own lists
    lora = next(p for p in ridge.gateway.registry.snapshot() if p.name == "lora")
    assert all(ADAPTER in e.adapters for e in lora.endpoints)
